"""Checkpoints of one trained role (actor or critic): weights, optimizer and schedule, written atomically.

A role's folder is a Hugging Face model folder (``config.json``, ``*.safetensors``; the actor's also
has its tokenizer) plus ``optimizer.pt`` (the full AdamW state, keyed by parameter name) and
``state.json`` (the schedule). Full state dicts are gathered to rank 0, which writes; every rank
loads (rank 0 reads, then broadcasts).

The folder is built beside its place and renamed into it. Replacing an existing one moves the old
one to ``.<name>.old`` for the instant between two renames; ``load`` and the next ``save`` recover it
if a crash fell into that instant. So a crash at any point leaves a complete checkpoint loadable.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from rlcore.atomic import publish, staging_dir
from rlcore.errors import RlcoreError
from rlcore_fsdp.distributed import barrier, rank, world_size
from rlcore_fsdp.optim import LrSchedule

FORMAT = 1
STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"


def _old(target: Path) -> Path:
    return target.parent / f".{target.name}.old"


def _recover(target: Path) -> None:
    """Put back a checkpoint left aside by a crash between the two renames of a replacement."""
    old = _old(target)
    if not target.exists() and (old / STATE_FILE).is_file():
        os.replace(old, target)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_directory(target: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder to fill; when the block ends without error it becomes ``target``
    (replacing any previous one), durably; on error it disappears and ``target`` is untouched."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _recover(target)
    staging = staging_dir(target)
    try:
        yield staging
        for file in staging.rglob("*"):
            if file.is_file():
                _fsync(file)
        old = _old(target)
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            os.replace(target, old)
        publish(staging, target)
        _fsync(target.parent)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _full_options(**extra) -> StateDictOptions:
    return StateDictOptions(full_state_dict=True, cpu_offload=True, **extra)


def save_checkpoint(directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                    schedule: LrSchedule, *, tokenizer=None, role: str) -> None:
    """Gather and write (on rank 0) the role's weights, optimizer and schedule into ``directory``."""
    model_state = get_model_state_dict(model, options=_full_options())
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=_full_options())
    if rank() == 0:
        with atomic_directory(directory) as staging:
            model.save_pretrained(staging, state_dict=model_state)
            if tokenizer is not None:
                tokenizer.save_pretrained(staging)
            torch.save(optimizer_state, staging / OPTIMIZER_FILE)
            state = {"format": FORMAT, "role": role, "schedule": schedule.state_dict()}
            (staging / STATE_FILE).write_text(json.dumps(state, indent=2))
    barrier()


def checkpoint_folder(directory: str | os.PathLike) -> Path:
    """The complete checkpoint at ``directory`` (recovering one a crash left aside), or an error."""
    target = Path(directory)
    if rank() == 0:
        _recover(target)
    barrier()
    if not (target / STATE_FILE).is_file():
        raise RlcoreError(f"{target} is not a complete rlcore fsdp checkpoint ({STATE_FILE} is missing)")
    return target


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise RlcoreError(f"{folder} holds no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(file))
    return weights


def load_weights(model: nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Full weights (on rank 0; other ranks pass {}) into the sharded ``model``. Tied parameters may be
    missing under their second name (transformers saves them once); anything else is an error."""
    options = _full_options(strict=False, broadcast_from_rank0=world_size() > 1)
    result = set_model_state_dict(model, weights, options=options)
    seen: set[int] = set()
    aliases = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            aliases.add(name)
        seen.add(id(param))
    missing = sorted(set(result.missing_keys) - aliases)
    if missing or result.unexpected_keys:
        raise RlcoreError(f"the weights in {source} do not fit the model: missing {missing[:5]}, "
                          f"unexpected {sorted(result.unexpected_keys)[:5]}")


def load_checkpoint(directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                    schedule: LrSchedule) -> None:
    folder = checkpoint_folder(directory)
    first = rank() == 0 or world_size() == 1
    load_weights(model, read_weights(folder) if first else {}, str(folder))
    optimizer_state = torch.load(folder / OPTIMIZER_FILE, weights_only=True) if first else {}
    set_optimizer_state_dict(model, optimizer, optimizer_state,
                             options=_full_options(broadcast_from_rank0=world_size() > 1))
    state = json.loads((folder / STATE_FILE).read_text())
    if state.get("format") != FORMAT:
        raise RlcoreError(f"{folder} was written in checkpoint format {state.get('format')}; "
                          f"this rlcore reads format {FORMAT}")
    schedule.load_state_dict(state["schedule"])
