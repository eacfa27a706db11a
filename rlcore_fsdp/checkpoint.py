"""Sharded checkpoints of one trained role (actor or critic), written atomically.

A role's folder::

    shards/         torch.distributed.checkpoint: every rank writes its own shards of the weights
                    ("model.<hf name>") and AdamW state ("optimizer.state.<hf name>.exp_avg", ...)
    huggingface/    config.json, generation_config.json and (actor) the tokenizer: what
                    ``rlcore export`` needs, with the shards, to write a Hugging Face model folder
    state.json      format, backend, role, ranks it was written by, compute dtype, schedule, and the
                    LoRA rank and alpha with the base model (null without LoRA). A LoRA checkpoint's
                    shards hold only what trained (adapters, a critic's value head) and their state;
                    the frozen base weights are the base model's
    lora_adapter/   a LoRA actor's adapter as a PEFT adapter folder (adapter_config.json,
                    adapter_model.safetensors): PEFT, vLLM or model.lora_adapter_path take it as it is
                    (resuming reads the shards, not this folder)

No rank ever holds more than its shards. Loading reshards: a checkpoint written by N ranks loads
onto M (torch.distributed.checkpoint matches shards to the new layout).

The folder is built beside its place (rank 0 makes it, every rank writes into it; a shared
filesystem when ranks are on several machines) and renamed into place by rank 0. Replacing an
existing one moves the old one to ``.<name>.old`` for the instant between two renames; ``load`` and
the next ``save`` recover it if a crash fell into that instant. So a crash at any point leaves a
complete checkpoint loadable.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.fsdp import FSDPModule

from rlcore.api import (
    LrSchedule,
    RlcoreError,
    image_processor_file,
    on_rank0,
    rank,
    recover_directory,
    world_size,
    write_folder,
    write_peft_adapter,
)
from rlcore_fsdp.sharding import gathered_peft_adapter

log = logging.getLogger(__name__)

FORMAT = 2
BACKEND = "fsdp"
STATE_FILE = "state.json"
SHARDS = "shards"
HF_FILES = "huggingface"
PEFT_ADAPTER = "lora_adapter"  # a LoRA actor's adapter as PEFT writes it (verl's folder name)
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
ALL_CONTENTS = ("model", "optimizer", "extra")  # what a checkpoint holds unless save_contents says less


def damage_reason(exc: BaseException) -> str:
    """The last line of torch's error (a CheckpointException carries each rank's whole traceback)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__


def _original_class(model: nn.Module) -> type:
    """The model's own class (FSDP2 puts its ``FSDP<name>`` subclass in front)."""
    return next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))


def write_hf_files(model: nn.Module, folder: Path, tokenizer=None) -> None:
    """The model's config (naming its own class), generation config and tokenizer into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.config)
    config.architectures = [_original_class(model).__name__]
    config.save_pretrained(folder)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    processor = image_processor_file(getattr(model.config, "_name_or_path", "") or "")
    if processor is not None:  # a vision-language model's image processor, for an exported folder to use
        shutil.copy2(processor, folder / processor.name)


def _model_state(model: nn.Module, lora: dict | None) -> dict:
    """The sharded weights a checkpoint holds: all of them, or with LoRA only what trains (adapters, a
    critic's head): the frozen base is the base model's, loaded at start. (torch's own
    ``ignore_frozen_params`` keeps a tied output head, which is frozen too.)"""
    state = get_model_state_dict(model)
    if not lora:
        return state
    trained = {name for name, param in model.named_parameters() if param.requires_grad}
    return {name: value for name, value in state.items() if name in trained}


def _refuse_nonfinite(model: nn.Module, role: str) -> None:
    """Raise on every rank when any rank's shard of a weight holds inf or NaN: such a checkpoint
    would be resumed from and poison the run again, so the previous one must stay the latest."""
    bad = next((name for name, param in model.named_parameters()
                if not torch.isfinite(param.to_local() if hasattr(param, "to_local") else param).all()), None)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        device = next(model.parameters()).device
        flag = torch.tensor([0 if bad is None else 1], device=device)
        torch.distributed.all_reduce(flag)  # all ranks stop together, none waits in the save's collectives
        if flag.item() and bad is None:
            raise RlcoreError(f"not saving the {role}: another rank's weights hold non-finite values (inf or NaN)")
    if bad is not None:
        raise RlcoreError(f"not saving the {role}: its weight {bad} holds non-finite values (inf or NaN), so the "
                          "training diverged; the previous checkpoint stays the latest")


def save_checkpoint(directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                    schedule: LrSchedule, *, tokenizer=None, role: str, compute_dtype: torch.dtype,
                    lora: dict | None = None, base_model: str | None = None,
                    contents: tuple[str, ...] = ALL_CONTENTS) -> None:
    """Every rank writes its shards of the role's weights and optimizer into ``directory``; rank 0
    adds the Hugging Face files and ``state.json`` and moves the folder into place. With ``lora``
    the shards hold the trained weights only, and ``state.json`` names the ``base_model``. Without
    "optimizer" in ``contents`` (``<role>.checkpoint.save_contents``) no optimizer state is written."""
    target = Path(directory)
    if rank() == 0:
        recover_directory(target, STATE_FILE)

    _refuse_nonfinite(model, role)

    adapter = []

    def write(staging: Path) -> None:
        state = {"model": _model_state(model, lora)}
        if lora and role == "actor":  # the adapter whole, for its PEFT folder: a collective, on every rank
            adapter.append(gathered_peft_adapter(model, lora, base_model, device=torch.device("cpu")))
        if "optimizer" in contents:
            state["optimizer"] = get_optimizer_state_dict(model, optimizer)
        dcp.save(state, checkpoint_id=str(staging / SHARDS))

    def finish(staging: Path) -> None:
        write_hf_files(model, staging / HF_FILES, tokenizer)
        if adapter:
            (staging / PEFT_ADAPTER).mkdir()
            write_peft_adapter(staging / PEFT_ADAPTER, *adapter[0])
        info = {"format": FORMAT, "backend": BACKEND, "role": role, "world_size": world_size(),
                "compute_dtype": DTYPE_NAMES.get(compute_dtype, str(compute_dtype)),
                "schedule": schedule.state_dict(), "lora": lora, "base_model": base_model if lora else None,
                "contents": list(contents)}
        (staging / STATE_FILE).write_text(json.dumps(info, indent=2))

    write_folder(target, write, finish, doing="writing the checkpoint")


def checkpoint_folder(directory: str | os.PathLike) -> Path:
    """The complete checkpoint at ``directory`` (recovering one a crash left aside), or an error."""
    target = Path(directory)
    on_rank0(lambda: recover_directory(target, STATE_FILE), "recovering the checkpoint")
    if not (target / STATE_FILE).is_file():
        raise RlcoreError(f"{target} is not a complete rlcore fsdp checkpoint ({STATE_FILE} is missing)")
    return target


def read_state(folder: Path) -> dict:
    """``state.json`` of a role folder, checked to be one this code reads."""
    try:
        state = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RlcoreError(f"{folder / STATE_FILE} is not valid JSON ({exc}): the checkpoint is damaged") from None
    if not isinstance(state, dict):
        raise RlcoreError(f"{folder / STATE_FILE} does not hold a checkpoint description: the checkpoint is damaged")
    if state.get("format") == 1:
        raise RlcoreError(f"{folder} is a checkpoint of an earlier rlcore (format 1: full weights in a Hugging Face "
                          f"folder); this rlcore reads format {FORMAT}. Its weights still load as a model: "
                          f"model.path = '{folder}'")
    if state.get("format") != FORMAT or state.get("backend") != BACKEND:
        raise RlcoreError(f"{folder} was written in checkpoint format {state.get('format')} by backend "
                          f"{state.get('backend')!r}; this is the fsdp backend, reading format {FORMAT}")
    return state


def saved_keys(folder: Path) -> set[str]:
    """The flattened keys stored in a checkpoint's shards ("model.<name>", "optimizer.state...")."""
    return set(dcp.FileSystemReader(str(folder / SHARDS)).read_metadata().state_dict_metadata)


def load_checkpoint(directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                    schedule: LrSchedule, *, base_model: str | None = None) -> None:
    """Weights, AdamW state and schedule from ``directory`` into the sharded ``model`` and its
    ``optimizer``, on any number of ranks. A LoRA checkpoint's adapters load onto the same base model
    only (``base_model``: the one this model was built from)."""
    folder = checkpoint_folder(directory)
    state = read_state(folder)
    try:
        stored = saved_keys(folder)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - torch's message names neither the file nor the step
        raise RlcoreError(f"{folder / SHARDS}/.metadata could not be read, the checkpoint is damaged: "
                          f"{damage_reason(exc)}") from exc
    if state.get("lora") and base_model is not None and state.get("base_model") != base_model:
        raise RlcoreError(f"{folder} holds LoRA adapters trained on {state.get('base_model')!r}, but this job's "
                          f"model is {base_model!r}: resume with that model")
    model_state = _model_state(model, state.get("lora"))
    expected = {f"model.{name}" for name in model_state}
    saved_model = {key for key in stored if key.startswith("model.")}
    if expected != saved_model:
        raise RlcoreError(f"the weights in {folder} do not fit the model: missing "
                          f"{sorted(k[6:] for k in expected - saved_model)[:5]}, unexpected "
                          f"{sorted(k[6:] for k in saved_model - expected)[:5]}")
    to_load = {"model": model_state}
    if "optimizer" not in state.get("contents", ALL_CONTENTS):
        if rank() == 0:
            log.warning("%s holds no optimizer state (saved with %s.checkpoint.save_contents = %s): the %s resumes "
                        "with a fresh AdamW (its moments start from zero)", folder, state["role"],
                        state["contents"], state["role"])
    elif any(key.startswith("optimizer.state.") for key in stored):
        to_load["optimizer"] = get_optimizer_state_dict(model, optimizer)  # fills AdamW's state to load into
    if state["world_size"] != world_size():
        log.info("%s was written by %d ranks; resharding it onto %d", folder, state["world_size"], world_size())
    try:
        dcp.load(to_load, checkpoint_id=str(folder / SHARDS))
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - e.g. "unexpected pos 704 vs 598" for a truncated shard
        raise RlcoreError(f"the shards in {folder / SHARDS} could not be read, the checkpoint is damaged: "
                          f"{damage_reason(exc)}") from exc
    set_model_state_dict(model, to_load["model"], options=StateDictOptions(strict=not state.get("lora")))
    if "optimizer" in to_load:
        set_optimizer_state_dict(model, optimizer, to_load["optimizer"])
    schedule.load_state_dict(state["schedule"])
