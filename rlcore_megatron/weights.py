"""Weights between Hugging Face (Llama, Qwen2) and megatron-core's GPT model, as pure functions on
plain tensors: names, fused layouts, tensor-parallel shards, pipeline stages, and buckets.

Megatron names used here are those of ``GPTModel`` built with the local layer spec, with *global*
layer numbers (``decoder.layers.<i>.``); a pipeline stage's module numbers its layers from 0, and
``local_name``/``global_name`` move between the two.

| Megatron (full tensor)                                  | Hugging Face                                      |
| ------------------------------------------------------- | ------------------------------------------------- |
| ``embedding.word_embeddings.weight`` (padded vocab)     | ``model.embed_tokens.weight``                     |
| ``decoder.layers.i.input_layernorm.weight``             | ``model.layers.i.input_layernorm.weight``         |
| ``decoder.layers.i.self_attention.linear_qkv.{weight,bias}`` | ``q_proj``, ``k_proj``, ``v_proj``, per query group |
| ``decoder.layers.i.self_attention.linear_proj.weight``  | ``model.layers.i.self_attn.o_proj.weight``        |
| ``decoder.layers.i.pre_mlp_layernorm.weight``           | ``model.layers.i.post_attention_layernorm.weight``|
| ``decoder.layers.i.mlp.linear_fc1.weight``              | ``gate_proj`` then ``up_proj``                    |
| ``decoder.layers.i.mlp.linear_fc2.weight``              | ``model.layers.i.mlp.down_proj.weight``           |
| ``decoder.final_layernorm.weight``                      | ``model.norm.weight``                             |
| ``output_layer.weight`` (padded vocab)                  | ``lm_head.weight`` (tied: the embedding)          |
| ``output_layer.{weight,bias}`` of a critic (value head) | ``score.{weight,bias}``                           |

Fused query/key/value: Megatron keeps, for each key/value group g in turn, that group's query heads,
then its key head, then its value head (``[q_g0 .. q_g(k-1), k_g, v_g]``, ``head_dim`` rows each), so
a tensor-parallel rank's share is a contiguous block of whole groups. The MLP's ``linear_fc1`` stacks
gate over up on every rank, so its share is rank r's gate rows over rank r's up rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
from torch import Tensor

from rlcore.api import RlcoreError
from rlcore_megatron.config_map import ModelShape, padded_vocab_size

Named = tuple[str, Tensor]

EMBEDDING = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT = "output_layer.weight"
OUTPUT_BIAS = "output_layer.bias"
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

# per-layer Megatron suffix -> Hugging Face suffix, for the tensors that map one to one
_LAYER_ONE_TO_ONE = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
QKV_WEIGHT = "self_attention.linear_qkv.weight"
QKV_BIAS = "self_attention.linear_qkv.bias"
FC1 = "mlp.linear_fc1.weight"

# how a full tensor is split over tensor-parallel ranks
COLUMN = "column"  # output rows split (dim 0): embedding, output layer, qkv (whole groups), fc1 (per half)
ROW = "row"  # input columns split (dim 1): linear_proj, linear_fc2
REPLICATED = "replicated"  # norms, the critic's value head


# -- names ---------------------------------------------------------------------------------------
def stage_layers(num_layers: int, pipeline_parallel: int, stage: int) -> range:
    """The global layer numbers pipeline stage ``stage`` holds: an even share, in order."""
    if num_layers % pipeline_parallel:
        raise RlcoreError(f"{num_layers} layers do not split evenly over {pipeline_parallel} pipeline stages")
    per_stage = num_layers // pipeline_parallel
    return range(stage * per_stage, (stage + 1) * per_stage)


def layer_suffixes(shape: ModelShape) -> list[str]:
    suffixes = ["input_layernorm.weight", QKV_WEIGHT]
    if shape.qkv_bias:
        suffixes.append(QKV_BIAS)
    return suffixes + ["self_attention.linear_proj.weight", "pre_mlp_layernorm.weight", FC1, "mlp.linear_fc2.weight"]


def stage_names(shape: ModelShape, pipeline_parallel: int = 1, stage: int = 0, *, value_head: bool = False
                ) -> list[str]:
    """The (global) Megatron parameter names pipeline stage ``stage`` holds, in module order. The last
    stage holds the output layer; with tied embeddings and more than one stage it keeps its own copy
    of the embedding there (Megatron keeps the two equal by summing their gradients)."""
    first, last = stage == 0, stage == pipeline_parallel - 1
    names = [EMBEDDING] if first else []
    for layer in stage_layers(shape.num_layers, pipeline_parallel, stage):
        names += [f"decoder.layers.{layer}.{suffix}" for suffix in layer_suffixes(shape)]
    if last:
        names.append(FINAL_NORM)
        if value_head:
            names += [OUTPUT, OUTPUT_BIAS] if shape.value_head_bias else [OUTPUT]
        elif not (shape.tied_embeddings and first):
            names.append(OUTPUT)
    return names


def local_name(name: str, layer_offset: int) -> str:
    """A global Megatron name as the stage's module spells it (layers numbered from its first)."""
    match = _LAYER.match(name)
    return f"decoder.layers.{int(match[1]) - layer_offset}.{match[2]}" if match else name


def global_name(name: str, layer_offset: int) -> str:
    match = _LAYER.match(name)
    return f"decoder.layers.{int(match[1]) + layer_offset}.{match[2]}" if match else name


def strip_wrappers(name: str) -> str:
    """A parameter name of a wrapped model (DDP's ``module.``, Float16Module's ``module.``) as the
    bare ``GPTModel`` spells it."""
    while name.startswith("module."):
        name = name[len("module."):]
    return name


# -- layouts -------------------------------------------------------------------------------------
def fuse_qkv(q: Tensor, k: Tensor, v: Tensor, shape: ModelShape) -> Tensor:
    """Hugging Face q (heads*d, ...), k and v (groups*d, ...) -> Megatron's fused rows, group by group."""
    groups, per_group, d = shape.num_query_groups, shape.heads_per_group, shape.head_dim
    rest = q.shape[1:]
    fused = torch.cat([q.reshape(groups, per_group * d, *rest), k.reshape(groups, d, *rest),
                       v.reshape(groups, d, *rest)], dim=1)  # (groups, (per_group + 2) * d, ...)
    return fused.reshape(groups * (per_group + 2) * d, *rest)


def split_qkv(fused: Tensor, shape: ModelShape, groups: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The inverse of ``fuse_qkv`` (for ``groups`` groups: a tensor-parallel share holds fewer)."""
    groups = shape.num_query_groups if groups is None else groups
    per_group, d = shape.heads_per_group, shape.head_dim
    rest = fused.shape[1:]
    grouped = fused.reshape(groups, (per_group + 2) * d, *rest)
    q, k, v = grouped.split([per_group * d, d, d], dim=1)
    return q.reshape(groups * per_group * d, *rest), k.reshape(groups * d, *rest), v.reshape(groups * d, *rest)


def _pad_rows(tensor: Tensor, rows: int) -> Tensor:
    if tensor.shape[0] == rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


# -- Hugging Face -> Megatron --------------------------------------------------------------------
def hf_sources(name: str, shape: ModelShape, *, value_head: bool = False) -> list[str]:
    """The Hugging Face tensors the (global) Megatron tensor ``name`` is made from."""
    if name == EMBEDDING:
        return ["model.embed_tokens.weight"]
    if name == FINAL_NORM:
        return ["model.norm.weight"]
    if name in (OUTPUT, OUTPUT_BIAS):
        if value_head:
            return ["score.weight" if name == OUTPUT else "score.bias"]
        return ["model.embed_tokens.weight" if shape.tied_embeddings else "lm_head.weight"]
    match = _LAYER.match(name)
    if match is None:
        raise RlcoreError(f"no Hugging Face name for Megatron parameter {name!r}")
    prefix, suffix = f"model.layers.{match[1]}.", match[2]
    if suffix in _LAYER_ONE_TO_ONE:
        return [prefix + _LAYER_ONE_TO_ONE[suffix]]
    if suffix in (QKV_WEIGHT, QKV_BIAS):
        kind = suffix.rsplit(".", 1)[1]
        return [f"{prefix}self_attn.{p}.{kind}" for p in ("q_proj", "k_proj", "v_proj")]
    if suffix == FC1:
        return [prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight"]
    raise RlcoreError(f"no Hugging Face name for Megatron parameter {name!r}")


def megatron_tensor(name: str, read: Callable[[str], Tensor], shape: ModelShape, *, tensor_parallel: int = 1,
                    value_head: bool = False) -> Tensor:
    """The full (unsharded) Megatron tensor ``name``, built from Hugging Face tensors that ``read``
    returns by name. The vocabulary is padded for ``tensor_parallel`` ranks with zero rows."""
    sources = [read(source) for source in hf_sources(name, shape, value_head=value_head)]
    suffix = (_LAYER.match(name) or [None, None, None])[2]
    if suffix in (QKV_WEIGHT, QKV_BIAS):
        return fuse_qkv(*sources, shape)
    if suffix == FC1:
        return torch.cat(sources)
    (tensor,) = sources
    if name == EMBEDDING or (name == OUTPUT and not value_head):
        return _pad_rows(tensor, padded_vocab_size(shape.vocab_size, tensor_parallel))
    return tensor


def hf_to_megatron(hf: Mapping[str, Tensor], shape: ModelShape, *, pipeline_parallel: int = 1, stage: int = 0,
                   tensor_parallel: int = 1, value_head: bool = False) -> dict[str, Tensor]:
    """Full Megatron tensors of one pipeline stage, by global name, from a Hugging Face state dict."""
    return {name: megatron_tensor(name, hf.__getitem__, shape, tensor_parallel=tensor_parallel, value_head=value_head)
            for name in stage_names(shape, pipeline_parallel, stage, value_head=value_head)}


# -- Megatron -> Hugging Face --------------------------------------------------------------------
def hf_tensors(name: str, tensor: Tensor, shape: ModelShape, *, value_head: bool = False,
               pipeline_parallel: int = 1) -> list[Named]:
    """The Hugging Face tensors in the full Megatron tensor ``name`` (padding dropped). A tied output
    layer (the last stage's copy of the embedding) gives nothing: the embedding is sent once."""
    if name == EMBEDDING:
        return [("model.embed_tokens.weight", tensor[:shape.vocab_size])]
    if name == FINAL_NORM:
        return [("model.norm.weight", tensor)]
    if name in (OUTPUT, OUTPUT_BIAS):
        if value_head:
            return [("score.weight" if name == OUTPUT else "score.bias", tensor)]
        return [] if shape.tied_embeddings else [("lm_head.weight", tensor[:shape.vocab_size])]
    sources = hf_sources(name, shape, value_head=value_head)
    suffix = _LAYER.match(name)[2]
    if suffix in (QKV_WEIGHT, QKV_BIAS):
        return list(zip(sources, split_qkv(tensor, shape)))
    if suffix == FC1:
        return list(zip(sources, tensor.chunk(2)))
    return [(sources[0], tensor)]


def megatron_to_hf(megatron: Mapping[str, Tensor], shape: ModelShape, *, value_head: bool = False
                   ) -> dict[str, Tensor]:
    """A Hugging Face state dict from full Megatron tensors (global names, any stages)."""
    return {hf_name: tensor for name, full in megatron.items()
            for hf_name, tensor in hf_tensors(name, full, shape, value_head=value_head)}


# -- tensor parallelism --------------------------------------------------------------------------
def parallel_kind(name: str, *, value_head: bool = False) -> str:
    if name in (EMBEDDING, OUTPUT, OUTPUT_BIAS):
        return REPLICATED if value_head and name != EMBEDDING else COLUMN
    match = _LAYER.match(name)
    suffix = match[2] if match else name
    if suffix in (QKV_WEIGHT, QKV_BIAS, FC1):
        return COLUMN
    if suffix in ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight"):
        return ROW
    return REPLICATED


def _is_fc1(name: str) -> bool:
    match = _LAYER.match(name)
    return bool(match) and match[2] == FC1


def tp_shard(name: str, full: Tensor, tensor_parallel: int, rank: int, *, value_head: bool = False) -> Tensor:
    """Rank ``rank``'s share of the full Megatron tensor ``name`` (a contiguous copy)."""
    kind = parallel_kind(name, value_head=value_head)
    if kind == REPLICATED or tensor_parallel == 1:
        return full.clone()
    if _is_fc1(name):
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(tensor_parallel)[rank], up.chunk(tensor_parallel)[rank]])
    dim = 0 if kind == COLUMN else 1
    if full.shape[dim] % tensor_parallel:
        raise RlcoreError(f"{name} of shape {tuple(full.shape)} does not split over {tensor_parallel} ranks")
    return full.chunk(tensor_parallel, dim=dim)[rank].contiguous()


def tp_merge(name: str, shards: list[Tensor], *, value_head: bool = False) -> Tensor:
    """The full tensor from every rank's share, in rank order (replicated: the first)."""
    kind = parallel_kind(name, value_head=value_head)
    if kind == REPLICATED or len(shards) == 1:
        return shards[0]
    if _is_fc1(name):
        halves = [shard.chunk(2) for shard in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(shards, dim=0 if kind == COLUMN else 1)


# -- buckets -------------------------------------------------------------------------------------
def buckets(named: Iterable[Named], bucket_bytes: int) -> Iterator[list[Named]]:
    """Consecutive groups of at most ``bucket_bytes`` (a larger single tensor comes alone), taken
    from ``named`` only as each bucket is asked for."""
    bucket: list[Named] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
