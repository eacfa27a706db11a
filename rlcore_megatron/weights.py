"""Weights between Hugging Face (Llama, Mistral, Phi-3, Qwen2, Qwen3, Qwen3-MoE) and megatron-core's GPT
model, as pure functions on plain tensors: names, fused layouts, tensor-parallel shards, pipeline stages, and buckets.

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
| ``decoder.layers.i.self_attention.{q,k}_layernorm.weight`` | ``model.layers.i.self_attn.{q,k}_norm.weight`` (Qwen3) |
| ``decoder.layers.i.mlp.router.weight``                  | ``model.layers.i.mlp.gate.weight`` (MoE)          |
| ``decoder.layers.i.mlp.experts.local_experts.e.linear_fc1.weight`` | ``...mlp.experts.e.gate_proj`` then ``up_proj`` |
| ``decoder.layers.i.mlp.experts.local_experts.e.linear_fc2.weight`` | ``...mlp.experts.e.down_proj.weight``  |
| ``decoder.final_layernorm.weight``                      | ``model.norm.weight``                             |
| ``output_layer.weight`` (padded vocab)                  | ``lm_head.weight`` (tied: the embedding)          |
| ``output_layer.{weight,bias}`` of a critic (value head) | ``score.{weight,bias}``                           |

Phi-3's checkpoints hold q, k and v stacked in one ``qkv_proj`` (every query row, then the keys, then the
values) and gate over up in one ``gate_up_proj``; they are unstacked and stacked again at the conversion
(``ModelShape.fused_projections``).

Fused query/key/value: Megatron keeps, for each key/value group g in turn, that group's query heads,
then its key head, then its value head (``[q_g0 .. q_g(k-1), k_g, v_g]``, ``head_dim`` rows each), so
a tensor-parallel rank's share is a contiguous block of whole groups. The MLP's ``linear_fc1`` stacks
gate over up on every rank, so its share is rank r's gate rows over rank r's up rows; so does each
expert's. Experts are numbered globally here (``local_experts.<e>``, e over all experts); an
expert-parallel rank's module holds an even, contiguous share of them numbered from 0, and
``local_name``/``global_name`` move between the two as they do for layers. The Hugging Face names are
those of the checkpoint files (one tensor per expert), which transformers and vLLM load.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
from torch import Tensor

from rlcore.api import RlcoreError
from rlcore_megatron.config_map import ModelShape, PipelineSplit, padded_vocab_size

Named = tuple[str, Tensor]

EMBEDDING = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT = "output_layer.weight"
OUTPUT_BIAS = "output_layer.bias"
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")

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
ROUTER = "mlp.router.weight"
QK_NORMS = {"self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
            "self_attention.k_layernorm.weight": "self_attn.k_norm.weight"}

# how a full tensor is split over tensor-parallel ranks
COLUMN = "column"  # output rows split (dim 0): embedding, output layer, qkv (whole groups), fc1 (per half)
ROW = "row"  # input columns split (dim 1): linear_proj, linear_fc2
REPLICATED = "replicated"  # norms, the critic's value head


# -- names ---------------------------------------------------------------------------------------
def stage_layers(num_layers: int, pipeline_parallel: int, stage: int, split: PipelineSplit = PipelineSplit()
                 ) -> range:
    """The global layer numbers pipeline stage ``stage`` holds, in order: an even share, or as
    ``split`` puts them."""
    sizes = split.sizes(num_layers, pipeline_parallel)
    start = sum(sizes[:stage])
    return range(start, start + sizes[stage])


def expert_range(count: int, expert_parallel: int, rank: int) -> range:
    """The global numbers of the experts expert-parallel rank ``rank`` holds: an even share, in order."""
    if count % expert_parallel:
        raise RlcoreError(f"{count} experts do not split evenly over {expert_parallel} expert-parallel ranks")
    per_rank = count // expert_parallel
    return range(rank * per_rank, (rank + 1) * per_rank)


def layer_suffixes(shape: ModelShape, expert_parallel: int = 1, expert_rank: int = 0) -> list[str]:
    """A layer's parameter names after ``decoder.layers.<i>.``, in module order; of a mixture of
    experts, the experts of ``expert_rank``."""
    suffixes = ["input_layernorm.weight", "self_attention.linear_proj.weight", QKV_WEIGHT]
    if shape.qkv_bias:
        suffixes.append(QKV_BIAS)
    if shape.qk_layernorm:
        suffixes += list(QK_NORMS)
    suffixes.append("pre_mlp_layernorm.weight")
    if shape.experts is None:
        return suffixes + [FC1, "mlp.linear_fc2.weight"]
    suffixes.append(ROUTER)
    for expert in expert_range(shape.experts.count, expert_parallel, expert_rank):
        suffixes += [f"mlp.experts.local_experts.{expert}.linear_fc1.weight",
                     f"mlp.experts.local_experts.{expert}.linear_fc2.weight"]
    return suffixes


def stage_names(shape: ModelShape, pipeline_parallel: int = 1, stage: int = 0, *, value_head: bool = False,
                expert_parallel: int = 1, expert_rank: int = 0, split: PipelineSplit = PipelineSplit()
                ) -> list[str]:
    """The (global) Megatron parameter names pipeline stage ``stage`` holds (of a mixture of experts,
    those of expert-parallel rank ``expert_rank``). The last stage holds the output layer; with tied
    embeddings and more than one stage it keeps its own copy of the embedding there (Megatron keeps
    the two equal by summing their gradients)."""
    first, last = stage == 0, stage == pipeline_parallel - 1
    names = [EMBEDDING] if first else []
    for layer in stage_layers(shape.num_layers, pipeline_parallel, stage, split):
        names += [f"decoder.layers.{layer}.{suffix}" for suffix in layer_suffixes(shape, expert_parallel, expert_rank)]
    if last:
        names.append(FINAL_NORM)
        if value_head:
            names += [OUTPUT, OUTPUT_BIAS] if shape.value_head_bias else [OUTPUT]
        elif not (shape.tied_embeddings and first):
            names.append(OUTPUT)
    return names


def _renumber(name: str, layer_shift: int, expert_shift: int) -> str:
    match = _LAYER.match(name)
    if match is None:
        return name
    suffix = match[2]
    expert = _EXPERT.match(suffix)
    if expert:
        suffix = f"mlp.experts.local_experts.{int(expert[1]) + expert_shift}.{expert[2]}.weight"
    return f"decoder.layers.{int(match[1]) + layer_shift}.{suffix}"


def local_name(name: str, layer_offset: int, expert_offset: int = 0) -> str:
    """A global Megatron name as the stage's module spells it (layers, and experts, numbered from
    its first)."""
    return _renumber(name, -layer_offset, -expert_offset)


def global_name(name: str, layer_offset: int, expert_offset: int = 0) -> str:
    return _renumber(name, layer_offset, expert_offset)


def is_expert(name: str) -> bool:
    """Whether ``name`` is one expert's parameter (held by one expert-parallel rank only)."""
    match = _LAYER.match(name)
    return bool(match) and bool(_EXPERT.match(match[2]))


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


def unstacked_qkv(stacked: Tensor, shape: ModelShape) -> tuple[Tensor, Tensor, Tensor]:
    """A checkpoint's one ``qkv_proj`` (all query heads, then the key heads, then the value heads: Phi-3's)
    -> q, k and v as separate checkpoints hold them."""
    queries, keys = shape.num_attention_heads * shape.head_dim, shape.num_query_groups * shape.head_dim
    if stacked.shape[0] != queries + 2 * keys:
        raise RlcoreError(f"a qkv_proj of {stacked.shape[0]} rows does not hold {shape.num_attention_heads} query and "
                          f"2 x {shape.num_query_groups} key/value heads of {shape.head_dim}")
    q, k, v = stacked.split([queries, keys, keys])
    return q, k, v


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
    if suffix in QK_NORMS:
        return [prefix + QK_NORMS[suffix]]
    if suffix == ROUTER:
        return [prefix + "mlp.gate.weight"]
    expert = _EXPERT.match(suffix)
    if expert:
        hf_expert = f"{prefix}mlp.experts.{expert[1]}."
        return ([hf_expert + "gate_proj.weight", hf_expert + "up_proj.weight"] if expert[2] == "linear_fc1"
                else [hf_expert + "down_proj.weight"])
    if suffix in (QKV_WEIGHT, QKV_BIAS):
        kind = suffix.rsplit(".", 1)[1]
        if shape.fused_projections:
            return [f"{prefix}self_attn.qkv_proj.{kind}"]
        return [f"{prefix}self_attn.{p}.{kind}" for p in ("q_proj", "k_proj", "v_proj")]
    if suffix == FC1:
        if shape.fused_projections:  # gate over up, as Megatron's fc1
            return [prefix + "mlp.gate_up_proj.weight"]
        return [prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight"]
    raise RlcoreError(f"no Hugging Face name for Megatron parameter {name!r}")


def megatron_tensor(name: str, read: Callable[[str], Tensor], shape: ModelShape, *, tensor_parallel: int = 1,
                    value_head: bool = False) -> Tensor:
    """The full (unsharded) Megatron tensor ``name``, built from Hugging Face tensors that ``read``
    returns by name. The vocabulary is padded for ``tensor_parallel`` ranks with zero rows."""
    sources = [read(source) for source in hf_sources(name, shape, value_head=value_head)]
    suffix = (_LAYER.match(name) or [None, None, None])[2]
    if suffix in (QKV_WEIGHT, QKV_BIAS):
        return fuse_qkv(*(unstacked_qkv(*sources, shape) if shape.fused_projections else sources), shape)
    if _is_fc1(name):
        return torch.cat(sources)
    (tensor,) = sources
    if name == EMBEDDING or (name == OUTPUT and not value_head):
        return _pad_rows(tensor, padded_vocab_size(shape.vocab_size, tensor_parallel))
    return tensor


def hf_to_megatron(hf: Mapping[str, Tensor], shape: ModelShape, *, pipeline_parallel: int = 1, stage: int = 0,
                   tensor_parallel: int = 1, value_head: bool = False, expert_parallel: int = 1,
                   expert_rank: int = 0) -> dict[str, Tensor]:
    """Full Megatron tensors of one pipeline stage (and expert-parallel rank), by global name, from a
    Hugging Face state dict."""
    return {name: megatron_tensor(name, hf.__getitem__, shape, tensor_parallel=tensor_parallel, value_head=value_head)
            for name in stage_names(shape, pipeline_parallel, stage, value_head=value_head,
                                    expert_parallel=expert_parallel, expert_rank=expert_rank)}


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
        q_k_v = split_qkv(tensor, shape)
        return [(sources[0], torch.cat(q_k_v))] if shape.fused_projections else list(zip(sources, q_k_v))
    if _is_fc1(name):
        return [(sources[0], tensor)] if shape.fused_projections else list(zip(sources, tensor.chunk(2)))
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
    expert = _EXPERT.match(suffix)
    if suffix in (QKV_WEIGHT, QKV_BIAS, FC1) or (expert and expert[2] == "linear_fc1"):
        return COLUMN
    if suffix in ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight") or expert:
        return ROW
    return REPLICATED


def _is_fc1(name: str) -> bool:
    """A dense MLP's or an expert's fused gate-over-up matrix."""
    match = _LAYER.match(name)
    if not match:
        return False
    expert = _EXPERT.match(match[2])
    return match[2] == FC1 or bool(expert and expert[2] == "linear_fc1")


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
# -- checkpoint names -> a transformers module's parameters ------------------------------------------
_HF_EXPERT = re.compile(r"^(.+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def module_slot(params: Mapping[str, Tensor], name: str, tensor: Tensor) -> tuple[Tensor, Tensor] | None:
    """(where in the module, the tensor to copy there) for a checkpoint tensor ``name``, or None when
    the module has no place for it. transformers 5 holds a mixture of experts' experts fused in its
    modules (``experts.gate_up_proj`` (E, 2I, H): each expert's gate rows over its up rows;
    ``experts.down_proj`` (E, H, I)) while its checkpoint files keep one tensor per expert."""
    if name in params:
        return params[name], tensor
    match = _HF_EXPERT.match(name)
    if match is None:
        return None
    prefix, expert, projection = match.group(1), int(match.group(2)), match.group(3)
    if projection == "down_proj":
        fused = params.get(f"{prefix}.down_proj")
        return None if fused is None else _oriented(fused[expert], tensor)
    fused = params.get(f"{prefix}.gate_up_proj")
    if fused is None:
        return None
    rows = tensor.shape[0]
    if fused.shape[1:] == (2 * rows, tensor.shape[1]):  # (E, 2I, H)
        half = fused[expert, :rows] if projection == "gate_proj" else fused[expert, rows:]
        return half, tensor
    half = fused[expert, :, :rows] if projection == "gate_proj" else fused[expert, :, rows:]  # (E, H, 2I)
    return half, tensor.T


def _oriented(slot: Tensor, tensor: Tensor) -> tuple[Tensor, Tensor]:
    return (slot, tensor) if slot.shape == tensor.shape else (slot, tensor.T)
