"""The device mesh the fsdp backend shards over, on the core's process group
(``rlcore.runtime.distributed.ensure_process_group``)."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from rlcore.api import Platform, RlcoreError, ensure_process_group

_meshes: dict[tuple[str, int], DeviceMesh] = {}


def shard_group_size(world: int, fsdp_size: int) -> int:
    """Ranks each model is sharded over: ``fsdp_size``, or all of them for -1 (or more than there are)."""
    shard = world if fsdp_size in (-1, 0) or fsdp_size >= world else fsdp_size
    if world % shard:
        raise RlcoreError(f"fsdp_size = {fsdp_size} does not divide the {world} training ranks into whole groups")
    return shard


def data_parallel_mesh(platform: Platform, fsdp_size: int = -1) -> DeviceMesh:
    """The mesh FSDP2 shards over: 1-D over every rank (plain FSDP) when ``fsdp_size`` is -1 or
    covers them all; else 2-D, (replicas, fsdp_size): each model is sharded within a group of
    ``fsdp_size`` consecutive ranks and the groups hold replicas (hybrid sharding, HSDP: gradients
    are reduce-scattered within a group, then averaged over the replicas)."""
    ensure_process_group(platform)
    world = dist.get_world_size()
    shard = shard_group_size(world, fsdp_size)
    key = (platform.device_type, shard)
    if key not in _meshes:
        _meshes[key] = (init_device_mesh(platform.device_type, (world,), mesh_dim_names=("dp",)) if shard == world
                        else init_device_mesh(platform.device_type, (world // shard, shard),
                                              mesh_dim_names=("replicate", "shard")))
    return _meshes[key]
