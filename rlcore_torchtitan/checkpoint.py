"""The torchtitan backend's checkpoints: the weights and AdamW's state as torch.distributed.checkpoint
shards (every rank writes its own, DTensors as they are), and beside them a Hugging Face folder of the
weights (``hf/``: config, safetensors, tokenizer) that transformers and the engines load as it is."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rlcore.api import LrSchedule, RlcoreError, world_size, write_folder
from rlcore_torchtitan.weights import hf_weights

SHARDS, HF_FOLDER, STATE_FILE = "shards", "hf", "state.json"
FORMAT = 1


def save_checkpoint(directory: str, module: nn.Module, optimizer: torch.optim.Optimizer, schedule: LrSchedule,
                    titan, *, tokenizer, compute_dtype: torch.dtype, contents: tuple[str, ...]) -> None:
    """Every rank writes its shards into ``directory``; rank 0 adds the Hugging Face folder (the weights in
    ``compute_dtype``) and ``state.json``; the folder appears only when complete."""
    weights = dict(hf_weights(module, titan.adapter, compute_dtype, torch.device("cpu")))  # a collective

    def write(staging: Path) -> None:
        model_state, optimizer_state = get_state_dict(module, optimizer)
        state = {"model": model_state} | ({"optimizer": optimizer_state} if "optimizer" in contents else {})
        dcp.save(state, checkpoint_id=str(staging / SHARDS))

    def finish(staging: Path) -> None:
        write_hf_folder(staging / HF_FOLDER, titan.hf_config, weights, compute_dtype, tokenizer)
        info = {"format": FORMAT, "backend": "torchtitan", "world_size": world_size(),
                "schedule": schedule.state_dict(), "contents": list(contents)}
        (staging / STATE_FILE).write_text(json.dumps(info, indent=2))

    write_folder(Path(directory), write, finish, doing="writing the checkpoint")


def write_hf_folder(folder: Path, hf_config, weights: dict, dtype: torch.dtype, tokenizer=None) -> None:
    """``weights`` (Hugging Face names) as a folder ``AutoModelForCausalLM.from_pretrained`` loads."""
    from transformers import AutoModelForCausalLM

    config = type(hf_config).from_dict(hf_config.to_dict())
    config.dtype = dtype
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)  # names, tied weights, config; no memory
    skeleton.save_pretrained(folder, state_dict=weights)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def load_checkpoint(directory: str, module: nn.Module, optimizer: torch.optim.Optimizer,
                    schedule: LrSchedule) -> None:
    folder = Path(directory)
    if not (folder / STATE_FILE).is_file():
        raise RlcoreError(f"{folder} is not a complete rlcore torchtitan checkpoint ({STATE_FILE} is missing)")
    info = json.loads((folder / STATE_FILE).read_text())
    model_state, optimizer_state = get_state_dict(module, optimizer)
    state = {"model": model_state} | ({"optimizer": optimizer_state} if "optimizer" in info["contents"] else {})
    dcp.load(state, checkpoint_id=str(folder / SHARDS))
    set_state_dict(module, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state.get("optimizer", optimizer_state))
    schedule.load_state_dict(info["schedule"])
