"""``rlcore export CHECKPOINT --to DIR``: a sharded fsdp checkpoint as a Hugging Face model folder.

CHECKPOINT is a role folder (``.../global_step_N/actor``), a step folder (``global_step_N``, whose
``actor/`` or ``critic/`` is taken by ``--role``), or a run directory (its latest checkpoint). The
shards' weights are put together on the CPU of this one process, no process group needed, cast
to ``--dtype`` and written with the checkpoint's config, generation config and tokenizer, so that
``AutoModelForCausalLM.from_pretrained(DIR)`` (the critic: ``AutoModelForTokenClassification``)
loads it. A LoRA checkpoint is written merged (the base model's weights with ``W + (alpha / r) B A``),
or with ``--adapter`` as the adapter alone, a PEFT adapter folder (``adapter_config.json``,
``adapter_model.safetensors``) that ``peft.PeftModel.from_pretrained(base, DIR)`` loads. DIR appears
only when complete.
"""

from __future__ import annotations

import argparse
import shutil
import warnings
from pathlib import Path

from rlcore.api import Command, RlcoreError

DTYPES = ("auto", "float32", "bfloat16", "float16")


def role_folder(checkpoint: Path, role: str) -> Path:
    """The role folder CHECKPOINT names, directly or through a step folder or a run directory."""
    from rlcore.api import CheckpointManager
    from rlcore_fsdp.checkpoint import STATE_FILE

    if (checkpoint / STATE_FILE).is_file() and not (checkpoint / role).is_dir():
        return checkpoint
    if (checkpoint / role / STATE_FILE).is_file():
        return checkpoint / role
    latest = CheckpointManager(checkpoint).latest() if checkpoint.is_dir() else None
    if latest is not None and (latest / role / STATE_FILE).is_file():
        return latest / role
    raise RlcoreError(f"{checkpoint} holds no {role} checkpoint: give a role folder (global_step_N/{role}), a "
                      "step folder (global_step_N) or a run directory (trainer.default_local_dir)")


def read_full_weights(folder: Path) -> dict:
    """Every full weight of a role folder's shards, by Hugging Face name, as CPU tensors."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from torch.distributed.checkpoint.api import CheckpointException

    from rlcore_fsdp.checkpoint import SHARDS, damage_reason

    reader = dcp.FileSystemReader(str(folder / SHARDS))
    try:
        stored = reader.read_metadata().state_dict_metadata
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - a missing or damaged .metadata file
        raise RlcoreError(f"{folder / SHARDS}/.metadata could not be read, the checkpoint is damaged: "
                          f"{damage_reason(exc)}") from exc
    weights = {key.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
               for key, meta in stored.items()
               if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)}
    if not weights:
        raise RlcoreError(f"{folder / SHARDS} holds no model weights")
    try:
        with warnings.catch_warnings():  # "torch.distributed is disabled ...": one process is the point
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({"model": weights}, storage_reader=reader, no_dist=True)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - torch's messages for a damaged shard name neither file nor step
        raise RlcoreError(f"the weights in {folder / SHARDS} could not be read, the checkpoint is damaged: "
                          f"{damage_reason(exc)}") from exc
    return weights


def base_weights(base_model: str, role: str) -> dict:
    """The frozen weights a LoRA checkpoint was trained on, loaded from its base model, by name."""
    import torch

    from rlcore.api import load_causal_lm, load_value_model

    try:
        load = load_value_model if role == "critic" else load_causal_lm
        model = load(base_model, torch.float32)
    except (OSError, ValueError) as exc:
        raise RlcoreError(f"this LoRA checkpoint holds adapters only; exporting it needs its base model "
                          f"{base_model!r}, which did not load: {exc}") from None
    return dict(model.state_dict())


def export_checkpoint(checkpoint: str, out: str, *, role: str = "actor", dtype: str = "auto",
                      adapter: bool = False) -> Path:
    """Write the ``role`` of ``checkpoint`` as a Hugging Face folder ``out`` (``adapter``: a LoRA
    checkpoint's adapter alone, as a PEFT adapter folder); returns its path."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    from rlcore.api import MANIFEST, is_vision_language, verified, write_peft_adapter
    from rlcore_fsdp.checkpoint import HF_FILES, read_state
    from rlcore_fsdp.lora import merged_weights, peft_adapter, with_base

    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise RlcoreError(f"{target} already exists and is not empty: remove it or export to another folder")
    folder = role_folder(Path(checkpoint), role)
    step_folder = folder.parent
    if (step_folder / MANIFEST).is_file():  # a role folder inside a step folder: check what the trainer wrote
        verified(step_folder, "rlcore export")
    state = read_state(folder)
    name = state["compute_dtype"] if dtype == "auto" else dtype
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    if adapter and not state.get("lora"):
        raise RlcoreError(f"{folder} holds no LoRA adapters (its job had model.lora_rank = 0): export it "
                          "without --adapter, as the whole model")
    if adapter and state["role"] == "critic":
        raise RlcoreError(f"{folder} is a critic: --adapter writes an actor's adapter; export the critic "
                          "without --adapter, merged with its value head")
    weights = read_full_weights(folder)
    config = AutoConfig.from_pretrained(folder / HF_FILES)
    config.dtype = torch_dtype
    model_class = AutoModelForTokenClassification if state["role"] == "critic" else AutoModelForCausalLM
    if state["role"] != "critic" and is_vision_language(config):
        from transformers import AutoModelForImageTextToText as model_class
    with torch.device("meta"):
        skeleton = model_class.from_config(config)  # names, tied weights and config; no memory
    if adapter:  # the adapter alone, as PEFT writes it
        adapter_config, tensors = peft_adapter(weights, skeleton, state["lora"], state["base_model"])
        tensors = {name: tensor.to(torch_dtype) for name, tensor in tensors.items()}
        return _written(target, lambda staging: write_peft_adapter(staging, adapter_config, tensors))
    if state.get("lora"):  # the base model's weights, the adapters merged in: a plain model of its architecture
        base = base_weights(state["base_model"], state["role"])
        weights = merged_weights(with_base(base, weights), state["lora"]["alpha"] / state["lora"]["rank"])
    weights = {key: value.to(torch_dtype) for key, value in weights.items()}

    def write_model(staging: Path) -> None:
        for file in (folder / HF_FILES).iterdir():  # tokenizer and generation config
            if file.is_file():
                shutil.copy2(file, staging / file.name)
        skeleton.save_pretrained(staging, state_dict=weights)

    return _written(target, write_model)


def _written(target: Path, write) -> Path:
    """``target`` (absent or an empty folder) written by ``write(staging)`` beside it, then moved into
    place whole; nothing is left behind if ``write`` fails."""
    from rlcore.api import publish, staging_dir

    if target.is_dir():
        target.rmdir()
    staging = staging_dir(target)
    try:
        write(staging)
        publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="role folder, global_step_N folder, or run directory")
    parser.add_argument("--to", required=True, metavar="DIR", help="the Hugging Face folder to write (new or empty)")
    parser.add_argument("--role", choices=("actor", "critic"), default="actor",
                        help="which model of a step folder (default: actor)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto",
                        help="dtype of the written weights; auto: the one the run computed in (default)")
    parser.add_argument("--adapter", action="store_true",
                        help="a LoRA checkpoint's adapter alone, as a PEFT adapter folder (default: the merged model)")


def _run(args: argparse.Namespace) -> int:
    target = export_checkpoint(args.checkpoint, args.to, role=args.role, dtype=args.dtype, adapter=args.adapter)
    print(f"wrote {target}")
    return 0


COMMAND = Command(help="write an fsdp checkpoint as a Hugging Face model folder", configure=_configure, run=_run)
