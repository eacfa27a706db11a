"""The process group every training backend works in, and what its ranks share.

A worker that already joined a process group (the hybrid worker does, one rank per device) is used
as it is. Otherwise: ``torchrun``-style variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) if set, else a group of one rank over a store in memory, so a backend also runs in a
plain Python process (tests, notebooks).

``all_to_all`` is the exchange with gradients that sequence (Ulysses) and context parallelism share.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from rlcore.errors import RlcoreError
from rlcore.runtime.atomic import replace_directory, staging_dir
from rlcore.runtime.platforms import Platform
from rlcore.runtime.rendezvous import store_at
from rlcore.runtime.stopping import stop_within


def placement() -> tuple[str, dict[str, list[str]]]:
    """(node id, the accelerator ids Ray gave this process), in a Ray worker: two workers on one device
    answer the same."""
    import ray

    context = ray.get_runtime_context()
    return context.get_node_id(), {kind: sorted(ids) for kind, ids in context.get_accelerator_ids().items() if ids}


def ensure_process_group(platform: Platform) -> None:
    if dist.is_initialized():
        return
    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        platform.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=platform.dist_init_backend, init_method="env://")
        return
    platform.set_device(0)
    _group_of_one(platform)


def join_process_group(platform: Platform, master: str, rank: int, world_size: int) -> None:
    """A worker's process group: over the store at ``master`` (``host:port``, which rank 0 hosts:
    ``rendezvous.host_store``), or for a group of one rank over a store in its memory, with no port at
    all."""
    if dist.is_initialized():
        return
    if world_size == 1:
        _group_of_one(platform)
        return
    dist.init_process_group(backend=platform.dist_init_backend, store=store_at(master, rank, world_size),
                            rank=rank, world_size=world_size)


def _group_of_one(platform: Platform) -> None:
    """A process group of this process alone, over a store in its memory: no port, no file left behind."""
    dist.init_process_group(backend=platform.dist_init_backend, store=dist.HashStore(), rank=0, world_size=1)


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
        try:
            write(staging)
        except BaseException as exc:  # a stop inside the write comes out as itself, whatever wrapped it
            stop = stop_within(exc)
            if stop is None or stop is exc:
                raise
            raise stop from exc
        on_rank0(finish_and_publish, doing)
    finally:
        if rank() == 0:
            shutil.rmtree(staging, ignore_errors=True)


# -- the all-to-all exchange, with gradients ------------------------------------------------------------
def _exchange(tensor: Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> Tensor:
    """``tensor`` cut into equal parts along ``scatter_dim``, part j sent to rank j of ``group``; the
    parts received, in rank order, joined along ``gather_dim``. One ``all_to_all_single`` over a
    buffer with ``scatter_dim`` first: NCCL's and gloo's (CPU) exchange alike, where gloo lacks the
    list form (``all_to_all``) before torch 2.12."""
    world = dist.get_world_size(group)
    if tensor.shape[scatter_dim] % world:
        raise ValueError(f"all_to_all: dimension {scatter_dim} of a {tuple(tensor.shape)} tensor does not split "
                         f"into {world} equal parts, one per rank of the group")
    sent = tensor.movedim(scatter_dim, 0).contiguous()
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=group)
    return torch.cat([part.movedim(0, scatter_dim) for part in received.chunk(world)], dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """``_exchange`` forward; backward, the reverse exchange of the gradient."""

    @staticmethod
    def forward(ctx, tensor: Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _exchange(tensor, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        scatter_dim, gather_dim = ctx.dims
        return _exchange(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(tensor: Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> Tensor:
    """Scatter ``scatter_dim`` over the ranks of ``group`` and gather ``gather_dim`` (Ulysses: trade a
    sequence split for a head split, and back); the gradient flows back by the reverse exchange."""
    return _AllToAll.apply(tensor, scatter_dim, gather_dim, group)
