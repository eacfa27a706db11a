"""The process group every training backend works in, and what its ranks share.

A worker that already joined a process group (the hybrid worker does, one rank per device) is used
as it is. Otherwise: ``torchrun``-style variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) if set, else a group of one rank over a file store, so a backend also runs in a
plain Python process (tests, notebooks).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore.atomic import replace_directory, staging_dir
from rlcore.errors import RlcoreError
from rlcore.platforms import Platform


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


def local_device(platform: Platform) -> torch.device:
    """This rank's device: ``LOCAL_RANK`` among the devices the process sees (one, under Ray)."""
    return platform.device(int(os.environ.get("LOCAL_RANK", "0")))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def from_rank0(value):
    """Rank 0's ``value`` on every rank."""
    if world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_rank0(action: Callable[[], None], doing: str) -> None:
    """Run ``action`` on rank 0; if it fails, every rank raises (none is left waiting).
    ``doing`` names the work for the other ranks' error ("writing the checkpoint")."""
    error = None
    if rank() == 0:
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, on rank 0 as it was
            error = exc
    message = from_rank0(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if message is not None:
        raise RlcoreError(f"rank 0 failed while {doing}: {message}")


def write_folder(target: Path, write: Callable[[Path], None], finish: Callable[[Path], None], *,
                 subfolders: tuple[str, ...] = (), doing: str = "writing") -> None:
    """``target`` written by every rank, appearing only when complete: rank 0 makes a staging folder
    beside it (with ``subfolders``) and names it to all; every rank runs ``write(staging)`` (its
    shards); rank 0 runs ``finish(staging)`` (the files only it writes) and puts the folder in place
    of any previous ``target``. If rank 0 fails every rank raises, and nothing half-written remains."""
    staging = None
    if rank() == 0:
        staging = staging_dir(target)
        for folder in subfolders:
            (staging / folder).mkdir()
    staging = Path(from_rank0(None if staging is None else str(staging)))

    def finish_and_publish() -> None:
        finish(staging)
        replace_directory(staging, target)

    try:
        write(staging)
        on_rank0(finish_and_publish, doing)
    finally:
        if rank() == 0:
            shutil.rmtree(staging, ignore_errors=True)
