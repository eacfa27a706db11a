"""Sharded checkpoints of a megatron role (actor or critic), written atomically, and export to a
Hugging Face folder.

A role's folder::

    dist/           megatron-core distributed checkpoint (``dist_checkpointing``): every rank writes
                    its shards of the weights (which load onto any layout) and of the distributed
                    optimizer's state (which resumes at the same tensor and pipeline parallel sizes)
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
import logging
import os
from pathlib import Path

import torch

from rlcore.api import (
    RlcoreError,
    on_rank0,
    rank,
    recover_directory,
    resolve_model_path,
    weight_buckets,
    write_folder,
)
from rlcore_megatron.config_map import PipelineSplit
from rlcore_megatron.model import hf_weight_stream

log = logging.getLogger(__name__)

FORMAT = 1
BACKEND = "megatron"
STATE_FILE = "state.json"
DIST = "dist"
HF_FILES = "huggingface"
EXPORT_SHARD_BYTES = 2 * 2**30
CLASS_PREFIX = {"llama": "Llama", "mistral": "Mistral", "phi3": "Phi3", "qwen2": "Qwen2", "qwen3": "Qwen3",
                "qwen3_moe": "Qwen3Moe"}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
ALL_CONTENTS = ("model", "optimizer", "extra")  # what a checkpoint holds unless save_contents says less


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


def _sharded_state(trained, *, is_loading: bool, optimizer: bool = True) -> dict:
    model_state = trained.gpt.sharded_state_dict()
    if not optimizer:
        return {"model": model_state}
    optimizer_state = trained.optimizer.sharded_state_dict(model_state, is_loading=is_loading,
                                                           metadata=dict(OPTIMIZER_FORMAT))
    return {"model": model_state, "optimizer": optimizer_state}


def save_checkpoint(directory: str | os.PathLike, trained, *, tokenizer=None,
                    contents: tuple[str, ...] = ALL_CONTENTS) -> None:
    """Every rank writes its shards of the role's weights and optimizer state into ``directory``;
    rank 0 adds the Hugging Face files and ``state.json`` and moves the folder into place. Without
    "optimizer" in ``contents`` (``<role>.checkpoint.save_contents``) no optimizer state is written."""
    from megatron.core import dist_checkpointing

    target = Path(directory)
    if rank() == 0:
        recover_directory(target, STATE_FILE)

    def write(staging: Path) -> None:
        dist_checkpointing.save(_sharded_state(trained, is_loading=False, optimizer="optimizer" in contents),
                                str(staging / DIST))

    def finish(staging: Path) -> None:
        write_hf_files(trained, staging / HF_FILES, tokenizer)
        layout = trained.layout
        info = {"format": FORMAT, "backend": BACKEND, "role": trained.role,
                "tensor_parallel": layout.tensor_parallel, "pipeline_parallel": layout.pipeline_parallel,
                "expert_parallel": layout.expert_parallel, "context_parallel": layout.context_parallel,
                "data_parallel": layout.data_parallel,
                "pipeline_stage_layers": _stage_layer_counts(trained),
                "compute_dtype": DTYPE_NAMES.get(trained.compute_dtype, str(trained.compute_dtype)),
                "schedule": trained.schedule.state_dict(), "contents": list(contents)}
        (staging / STATE_FILE).write_text(json.dumps(info, indent=2))

    write_folder(target, write, finish, subfolders=(DIST,), doing="writing the checkpoint")


def read_state(folder: Path) -> dict:
    on_rank0(lambda: recover_directory(folder, STATE_FILE), "recovering the checkpoint")
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


def _stage_layer_counts(trained) -> list[int]:
    config = trained.gpt.config
    split = PipelineSplit.of(config)
    return split.sizes(trained.shape.num_layers, trained.layout.pipeline_parallel)


def load_checkpoint(directory: str | os.PathLike, trained) -> None:
    """Weights, optimizer state and schedule from ``directory``, at the tensor, pipeline and expert
    parallel sizes it was saved at (the optimizer state's format needs them; any data-parallel size)."""
    from megatron.core import dist_checkpointing

    folder = Path(directory)
    state = read_state(folder)
    if "optimizer" not in state.get("contents", ALL_CONTENTS):
        _load_weights_only(folder, state, trained)
        return
    # checkpoints written before expert parallelism have no "expert_parallel": they were dense, at 1
    saved = (state.get("tensor_parallel"), state.get("pipeline_parallel"), state.get("expert_parallel", 1))
    layout = trained.layout
    running = (layout.tensor_parallel, layout.pipeline_parallel, layout.expert_parallel)
    stages = state.get("pipeline_stage_layers")  # absent before uneven splits: even then
    if saved == running and stages is not None and stages != _stage_layer_counts(trained):
        raise RlcoreError(f"{folder / STATE_FILE}: saved with {stages} layers on the pipeline stages, this job puts "
                          f"{_stage_layer_counts(trained)}; the optimizer state resumes only at the same split: set "
                          "num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage as saved")
    if saved != running:
        raise RlcoreError(f"{folder / STATE_FILE}: saved at tensor/pipeline/expert parallel sizes "
                          f"{'/'.join(map(str, saved))}, this job runs {'/'.join(map(str, running))}; the optimizer "
                          "state resumes only at the same sizes: set [actor.megatron] (and [critic.megatron]) "
                          "tensor_model_parallel_size, pipeline_model_parallel_size and expert_model_parallel_size "
                          "to the saved ones")
    _create_optimizer_state(trained.optimizer)
    loaded = dist_checkpointing.load(_sharded_state(trained, is_loading=True), str(folder / DIST))
    # no autograd: in fp32 the optimizer's main parameters are the model's own leaf parameters, which
    # megatron-core's DistributedOptimizer.load_state_dict copies into in place
    with torch.no_grad():
        trained.gpt.load_state_dict(loaded["model"])
        trained.optimizer.load_state_dict(loaded["optimizer"])
    trained.schedule.load_state_dict(state["schedule"])


def _load_weights_only(folder: Path, state: dict, trained) -> None:
    """Weights and schedule of a checkpoint saved without its optimizer state (the weights load onto
    any layout); the optimizer starts fresh, which one warning says."""
    from megatron.core import dist_checkpointing

    if rank() == 0:
        log.warning("%s holds no optimizer state (saved with %s.checkpoint.save_contents = %s): the %s resumes "
                    "with a fresh optimizer (Adam's moments start from zero)", folder, state["role"],
                    state["contents"], state["role"])
    loaded = dist_checkpointing.load(_sharded_state(trained, is_loading=True, optimizer=False), str(folder / DIST))
    with torch.no_grad():
        trained.gpt.load_state_dict(loaded["model"])
    trained.optimizer.reload_model_params()  # the distributed optimizer's fp32 main weights from the loaded ones
    trained.schedule.load_state_dict(state["schedule"])


def export_huggingface(trained, directory: str | os.PathLike, *, dtype: torch.dtype | None = None,
                       tokenizer=None) -> None:
    """The role's current weights as a Hugging Face folder (``model-0000N.safetensors`` with an index,
    config, generation config, tokenizer) that transformers loads: ``AutoModelForCausalLM`` for the
    actor, ``AutoModelForTokenClassification`` for the critic. Every rank takes part; rank 0 writes,
    one shard of at most ``EXPORT_SHARD_BYTES`` at a time, and moves the folder into place."""
    from safetensors.torch import save_file

    dtype = dtype or trained.compute_dtype
    weight_map: dict[str, str] = {}

    def write(staging: Path) -> None:  # every rank gathers; rank 0 writes one shard at a time
        stream = hf_weight_stream(trained.gpt, trained.shape, trained.layout, dtype, value_head=trained.value_head)
        for number, bucket in enumerate(weight_buckets(stream, EXPORT_SHARD_BYTES), start=1):
            if rank() == 0:
                file = f"model-{number:05d}.safetensors"
                save_file({name: tensor.cpu().contiguous() for name, tensor in bucket}, str(staging / file),
                          metadata={"format": "pt"})
                weight_map.update({name: file for name, _ in bucket})

    def finish(staging: Path) -> None:
        index = {"metadata": {}, "weight_map": weight_map}
        (staging / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        write_hf_files(trained, staging, tokenizer)

    write_folder(Path(directory), write, finish, doing="exporting the model")
