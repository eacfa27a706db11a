"""The device mesh the fsdp backend shards over, on the core's process group
(``rlcore.distributed.ensure_process_group``)."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from rlcore.api import Platform, ensure_process_group

_meshes: dict[str, DeviceMesh] = {}


def data_parallel_mesh(platform: Platform) -> DeviceMesh:
    """A 1-D mesh over every rank of the default group (pure data parallel, the FSDP dimension)."""
    ensure_process_group(platform)
    if platform.device_type not in _meshes:
        _meshes[platform.device_type] = init_device_mesh(
            platform.device_type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    return _meshes[platform.device_type]
