"""Sharded checkpoints of a megatron role (actor or critic), written atomically, and export to a
Hugging Face folder.

A role's folder::

    dist/           megatron-core distributed checkpoint (``dist_checkpointing``): every rank writes
                    its shards of the weights and of the optimizer state; it loads onto another
                    tensor/pipeline/data-parallel layout
    huggingface/    config.json (naming the transformers class), generation config and (actor) the
                    tokenizer
    state.json      format, backend, role, the layout it was written by, compute dtype, schedule

The folder is built beside its place (rank 0 makes it, every rank writes into it: ranks on several
machines need a shared filesystem) and renamed into place by rank 0, so a crash leaves the previous
checkpoint loadable.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore.atomic import publish, staging_dir
from rlcore.errors import RlcoreError
from rlcore.models import resolve_model_path
from rlcore_megatron.model import hf_weight_stream
from rlcore_megatron.weights import buckets

FORMAT = 1
BACKEND = "megatron"
STATE_FILE = "state.json"
DIST = "dist"
HF_FILES = "huggingface"
EXPORT_SHARD_BYTES = 2 * 2**30
CLASS_PREFIX = {"llama": "Llama", "qwen2": "Qwen2"}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _share(value):
    """Rank 0's ``value`` on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _on_rank0(action: Callable[[], None]) -> None:
    """Run ``action`` on rank 0; if it fails, every rank raises (none is left waiting)."""
    error = None
    if _rank() == 0:
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, on rank 0 as it was
            error = exc
    message = _share(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if message is not None:
        raise RlcoreError(f"rank 0 failed while writing: {message}")


def _staging(target: Path, *subfolders: str) -> Path:
    """A hidden folder beside ``target`` (with ``subfolders``), made by rank 0 and named to all."""
    staging = None
    if _rank() == 0:
        staging = staging_dir(target)
        for folder in subfolders:
            (staging / folder).mkdir()
    return Path(_share(None if staging is None else str(staging)))


def _replace(staging: Path, target: Path) -> None:
    old = target.parent / f".{target.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    publish(staging, target)
    shutil.rmtree(old, ignore_errors=True)


def write_hf_files(trained, folder: Path, tokenizer=None) -> None:
    """The role's Hugging Face config (naming the causal-LM or token-classification class),
    generation config and tokenizer."""
    from transformers import GenerationConfig

    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(trained.hf_config)
    prefix = CLASS_PREFIX[trained.shape.model_type]
    if trained.value_head:
        config.architectures = [f"{prefix}ForTokenClassification"]
        config.num_labels = 1
    else:
        config.architectures = [f"{prefix}ForCausalLM"]
    config.save_pretrained(folder)
    try:
        GenerationConfig.from_pretrained(resolve_model_path(trained.path)).save_pretrained(folder)
    except OSError:
        pass
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


# The distributed optimizer's state as megatron-core's own training saves it by default: per bucket,
# resumable at another data-parallel size but the same tensor and pipeline parallel sizes. (0.19's
# model-space formats fail with torch's Adam: 'fully_sharded_model_space' on its own ShardedTensor
# check, 'fully_reshardable' on loading Adam's 'step'.) The model's weights reshard freely.
OPTIMIZER_FORMAT = {"distrib_optim_sharding_type": "dp_reshardable"}


def _sharded_state(trained, *, is_loading: bool) -> dict:
    model_state = trained.gpt.sharded_state_dict()
    optimizer_state = trained.optimizer.sharded_state_dict(model_state, is_loading=is_loading,
                                                           metadata=dict(OPTIMIZER_FORMAT))
    return {"model": model_state, "optimizer": optimizer_state}


def save_checkpoint(directory: str | os.PathLike, trained, *, tokenizer=None) -> None:
    """Every rank writes its shards of the role's weights and optimizer state into ``directory``;
    rank 0 adds the Hugging Face files and ``state.json`` and moves the folder into place."""
    from megatron.core import dist_checkpointing

    target = Path(directory)
    staging = _staging(target, DIST)
    try:
        dist_checkpointing.save(_sharded_state(trained, is_loading=False), str(staging / DIST))

        def finish() -> None:
            write_hf_files(trained, staging / HF_FILES, tokenizer)
            layout = trained.layout
            info = {"format": FORMAT, "backend": BACKEND, "role": trained.role,
                    "tensor_parallel": layout.tensor_parallel, "pipeline_parallel": layout.pipeline_parallel,
                    "data_parallel": layout.data_parallel,
                    "compute_dtype": DTYPE_NAMES.get(trained.compute_dtype, str(trained.compute_dtype)),
                    "schedule": trained.schedule.state_dict()}
            (staging / STATE_FILE).write_text(json.dumps(info, indent=2))
            _replace(staging, target)

        _on_rank0(finish)
    finally:
        if _rank() == 0:
            shutil.rmtree(staging, ignore_errors=True)


def read_state(folder: Path) -> dict:
    if not (folder / STATE_FILE).is_file():
        raise RlcoreError(f"{folder} is not a complete rlcore megatron checkpoint ({STATE_FILE} is missing)")
    state = json.loads((folder / STATE_FILE).read_text())
    if state.get("backend") != BACKEND or state.get("format") != FORMAT:
        raise RlcoreError(f"{folder} was written in checkpoint format {state.get('format')} by backend "
                          f"{state.get('backend')!r}; this is the megatron backend, reading format {FORMAT}")
    return state


def _create_optimizer_state(optimizer) -> None:
    """torch's Adam creates its state (step, moments) on its first step, and megatron-core (without
    Apex or TransformerEngine) reads that state to build the state dict it loads into. A fresh
    optimizer gets it from a step that changes nothing (zero gradients, no learning rate, no weight
    decay); loading then overwrites it."""
    for torch_optimizer in (part.optimizer for part in getattr(optimizer, "chained_optimizers", [optimizer])):
        if torch_optimizer.state:
            continue
        settings = [(group["lr"], group["weight_decay"]) for group in torch_optimizer.param_groups]
        for group in torch_optimizer.param_groups:
            group["lr"], group["weight_decay"] = 0.0, 0.0
            for param in group["params"]:
                param.grad = torch.zeros_like(param) if param.numel() else None
        torch_optimizer.step()
        torch_optimizer.zero_grad(set_to_none=True)
        for group, (lr, weight_decay) in zip(torch_optimizer.param_groups, settings):
            group["lr"], group["weight_decay"] = lr, weight_decay


def load_checkpoint(directory: str | os.PathLike, trained) -> None:
    """Weights, optimizer state and schedule from ``directory``, onto any Megatron layout."""
    from megatron.core import dist_checkpointing

    folder = Path(directory)
    state = read_state(folder)
    _create_optimizer_state(trained.optimizer)
    loaded = dist_checkpointing.load(_sharded_state(trained, is_loading=True), str(folder / DIST))
    trained.gpt.load_state_dict(loaded["model"])
    trained.optimizer.load_state_dict(loaded["optimizer"])
    trained.schedule.load_state_dict(state["schedule"])


def export_huggingface(trained, directory: str | os.PathLike, *, dtype: torch.dtype | None = None,
                       tokenizer=None) -> None:
    """The role's current weights as a Hugging Face folder (``model-0000N.safetensors`` with an index,
    config, generation config, tokenizer) that transformers loads: ``AutoModelForCausalLM`` for the
    actor, ``AutoModelForTokenClassification`` for the critic. Every rank takes part; rank 0 writes,
    one shard of at most ``EXPORT_SHARD_BYTES`` at a time, and moves the folder into place."""
    from safetensors.torch import save_file

    dtype = dtype or trained.compute_dtype
    target = Path(directory)
    staging = _staging(target)
    weight_map: dict[str, str] = {}
    try:
        stream = hf_weight_stream(trained.gpt, trained.shape, trained.layout, dtype, value_head=trained.value_head)
        for number, bucket in enumerate(buckets(stream, EXPORT_SHARD_BYTES), start=1):
            if _rank() == 0:
                file = f"model-{number:05d}.safetensors"
                save_file({name: tensor.cpu().contiguous() for name, tensor in bucket}, str(staging / file),
                          metadata={"format": "pt"})
                weight_map.update({name: file for name, _ in bucket})

        def finish() -> None:
            index = {"metadata": {}, "weight_map": weight_map}
            (staging / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
            write_hf_files(trained, staging, tokenizer)
            _replace(staging, target)

        _on_rank0(finish)
    finally:
        if _rank() == 0:
            shutil.rmtree(staging, ignore_errors=True)
