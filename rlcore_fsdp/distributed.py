"""The process group and device mesh the backend shards over.

A worker that already joined a process group (the hybrid worker does, one rank per device) is used
as it is. Otherwise: ``torchrun``-style variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) if set, else a group of one rank over a file store, so the backend also runs in a
plain Python process (tests, notebooks).
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from rlcore.platforms import Platform

_meshes: dict[str, DeviceMesh] = {}


def ensure_process_group(platform: Platform) -> None:
    if dist.is_initialized():
        return
    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        platform.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=platform.dist_init_backend, init_method="env://")
        return
    platform.set_device(0)
    store_file = os.path.join(tempfile.mkdtemp(prefix="rlcore-dist-"), "store")
    dist.init_process_group(backend=platform.dist_init_backend, store=dist.FileStore(store_file, 1),
                            rank=0, world_size=1)


def data_parallel_mesh(platform: Platform) -> DeviceMesh:
    """A 1-D mesh over every rank of the default group (pure data parallel, the FSDP dimension)."""
    ensure_process_group(platform)
    if platform.device_type not in _meshes:
        _meshes[platform.device_type] = init_device_mesh(
            platform.device_type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    return _meshes[platform.device_type]


def local_device(platform: Platform) -> torch.device:
    """This rank's device: ``LOCAL_RANK`` among the devices the process sees (one, under Ray)."""
    return platform.device(int(os.environ.get("LOCAL_RANK", "0")))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
