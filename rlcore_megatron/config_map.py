"""A Hugging Face model config -> the arguments of megatron-core's ``TransformerConfig`` and ``GPTModel``.

Pure: reads the config's attributes and returns plain values (no megatron import), so it is checked on
any machine. Llama, Mistral, Phi-3, Qwen2 and Qwen3 are supported (untied and tied embeddings, grouped-query
attention, RoPE with default, linear or Llama-3 scaling, partial rotary, RMSNorm, SwiGLU, Mistral's and Phi-3's
sliding-window attention, Phi-3's fused projections, Qwen3's query/key norms), and Qwen3-MoE
(every layer a mixture of experts: a softmax router picking ``num_experts_per_tok`` experts, each a
SwiGLU MLP); anything else is an ``RlcoreError`` naming the model's ``model_type`` and ``architectures``.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from rlcore.api import RlcoreError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe")
# what keeps a family the fsdp backend trains (docs/models.md) off this mapping
NOT_MAPPED = {
    "gemma2": "Gemma 2's attention and final-logit soft-capping, its sqrt(hidden)-scaled embedding, its norms "
              "around each attention and MLP (1 + weight) and its GeGLU MLP are not mapped",
    "deepseek_v3": "DeepSeek-V3's multi-head latent attention (low-rank query and key/value) and its sigmoid-scored, "
                   "grouped routing with shared experts and dense first layers are not mapped",
}
# megatron-core's Llama-3 RoPE scaling fixes these (RotaryEmbedding._apply_scaling); only the factor is free
MEGATRON_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@attrs.frozen
class Rope:
    theta: float = 10000.0
    scaling: str = "default"  # "default", "linear" or "llama3"
    factor: float = 1.0
    rotary_percent: float = 1.0


@attrs.frozen
class Experts:
    """A mixture-of-experts MLP in every layer: a router scores ``count`` experts, each token goes to
    its ``top_k`` best, each a SwiGLU MLP of ``ffn_hidden_size`` columns; their outputs are summed
    weighted by the router's softmax probabilities (renormalised over the chosen ones when
    ``norm_top_k``)."""

    count: int
    top_k: int
    ffn_hidden_size: int
    norm_top_k: bool


@attrs.frozen
class MoeSettings:
    """How megatron-core routes and dispatches a mixture of experts' tokens, beyond what the model
    fixes (verl's ``override_transformer_config.moe_*``, rlcore's ``[<role>.megatron] moe_*``)."""

    token_dispatcher: str = "alltoall"  # or "allgather" (the CPU's: gloo has no all-to-all)
    router_dtype: str | None = None  # "fp32", "fp64": the router's logits and softmax; None: the model's dtype
    load_balancing: str | None = None  # None: "aux_loss" when aux_loss_coeff > 0, else "none"
    aux_loss_coeff: float = 0.0
    z_loss_coeff: float | None = None


@attrs.frozen
class PipelineSplit:
    """Layers per pipeline stage: an even share each; or ``first`` / ``last`` layers on the first /
    last stage and an even share of the rest on the stages between (megatron-core's
    ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage``); or, with
    ``embedding`` / ``loss`` (megatron-core's ``account_for_embedding_in_pipeline_split`` /
    ``account_for_loss_in_pipeline_split``), an even share of the layers with the embedding counted as
    one more layer of the first stage and the loss as one more of the last."""

    first: int | None = None
    last: int | None = None
    embedding: bool = False
    loss: bool = False

    @classmethod
    def of(cls, config) -> "PipelineSplit":
        """The split of megatron-core's ``TransformerConfig``."""
        return cls(config.num_layers_in_first_pipeline_stage, config.num_layers_in_last_pipeline_stage,
                   config.account_for_embedding_in_pipeline_split, config.account_for_loss_in_pipeline_split)

    def sizes(self, num_layers: int, stages: int) -> list[int]:
        """The layer count of each stage, or an error naming what does not divide."""
        if stages == 1:
            return [num_layers]
        if self.embedding or self.loss:
            return self._counted_sizes(num_layers, stages)
        ends = [size for size in (self.first, self.last) if size is not None]
        middle, rest = stages - len(ends), num_layers - sum(ends)
        if rest < 0 or (middle == 0 and rest) or (middle and (rest == 0 or rest % middle)):
            split = (f" with {self.first} on the first stage" if self.first is not None else "") + \
                    (f" with {self.last} on the last stage" if self.last is not None else "")
            raise RlcoreError(f"{num_layers} layers do not split evenly over {stages} pipeline stages{split}")
        share = rest // middle if middle else 0
        return [self.first if self.first is not None else share, *[share] * (stages - 2),
                self.last if self.last is not None else share]

    def _counted_sizes(self, num_layers: int, stages: int) -> list[int]:
        """An even share of the layers plus the embedding and the loss, each counted as a layer; the
        first stage holds one layer fewer for the embedding, the last one fewer for the loss."""
        counted = [name for name, on in (("the embedding", self.embedding), ("the loss", self.loss)) if on]
        if self.first is not None or self.last is not None:
            raise RlcoreError(f"counting {' and '.join(counted)} as a layer of the pipeline split and "
                              "num_layers_in_first/last_pipeline_stage exclude each other (megatron-core takes one "
                              "or the other)")
        total = num_layers + len(counted)
        if total % stages:
            raise RlcoreError(f"{num_layers} layers and {' and '.join(counted)} ({total} counted) do not split "
                              f"evenly over {stages} pipeline stages")
        sizes = [total // stages] * stages
        sizes[0] -= self.embedding
        sizes[-1] -= self.loss
        if min(sizes) < 1:
            raise RlcoreError(f"{num_layers} layers and {' and '.join(counted)} over {stages} pipeline stages leave "
                              "a stage without a layer")
        return sizes

    def kwargs(self, stages: int) -> dict[str, int | bool]:
        """megatron-core's TransformerConfig arguments (none without pipeline parallelism)."""
        if stages == 1:
            return {}
        return {key: value for key, value in (("num_layers_in_first_pipeline_stage", self.first),
                                              ("num_layers_in_last_pipeline_stage", self.last),
                                              ("account_for_embedding_in_pipeline_split", self.embedding or None),
                                              ("account_for_loss_in_pipeline_split", self.loss or None))
                if value is not None}


@attrs.frozen
class ModelShape:
    """What the Megatron model and the weight conversion need to know about a decoder-only model."""

    model_type: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int  # key/value heads (GQA); = num_attention_heads without GQA
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    norm_epsilon: float
    max_position_embeddings: int
    rope: Rope = Rope()
    initializer_range: float = 0.02
    value_head_bias: bool = True  # transformers' token-classification head (the critic's) has a bias
    qk_layernorm: bool = False  # Qwen3: an RMSNorm over each query and key head
    experts: Experts | None = None  # a mixture of experts in every layer (Qwen3-MoE); None: a dense MLP
    # every layer's queries see only the last ``sliding_window`` positions, their own included (Mistral's
    # and Phi-3's ``sliding_window``, as transformers applies it); None: the whole causal prefix
    sliding_window: int | None = None
    # the Hugging Face checkpoint holds q/k/v as one ``qkv_proj`` and gate/up as one ``gate_up_proj`` (Phi-3)
    fused_projections: bool = False

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups


def _describe(hf_config) -> str:
    return (f"model_type {getattr(hf_config, 'model_type', None)!r}, "
            f"architectures {list(getattr(hf_config, 'architectures', None) or [])}")


def _unsupported(hf_config, why: str) -> RlcoreError:
    return RlcoreError(f"trainer.backend = 'megatron' cannot build this model ({_describe(hf_config)}): {why}")


def _rope_parameters(hf_config) -> dict[str, Any]:
    """RoPE settings across transformers versions: 5.x keeps them in ``rope_parameters``, 4.x in
    ``rope_theta`` and ``rope_scaling``."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        return dict(params)
    params = dict(getattr(hf_config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    return params


def rope_settings(hf_config) -> Rope:
    params = _rope_parameters(hf_config)
    kind = params.get("rope_type") or params.get("type") or "default"
    theta = float(params.get("rope_theta", 10000.0))
    percent = float(getattr(hf_config, "partial_rotary_factor", 1.0) or 1.0)
    if kind == "default":
        return Rope(theta=theta, rotary_percent=percent)
    if kind == "linear":
        return Rope(theta=theta, scaling="linear", factor=float(params["factor"]), rotary_percent=percent)
    if kind == "llama3":
        fixed = {key: float(params.get(key, value)) for key, value in MEGATRON_LLAMA3_ROPE.items()}
        if fixed != MEGATRON_LLAMA3_ROPE:
            raise _unsupported(hf_config, f"Llama-3 RoPE scaling with {fixed}; megatron-core computes it with "
                                          f"{MEGATRON_LLAMA3_ROPE} and only the factor as a setting")
        return Rope(theta=theta, scaling="llama3", factor=float(params["factor"]), rotary_percent=percent)
    raise _unsupported(hf_config, f"RoPE scaling {kind!r}; supported: default, linear, llama3")


def model_shape(hf_config) -> ModelShape:
    """The shape of a supported model (``SUPPORTED_MODEL_TYPES``) from its Hugging Face config, or an
    error saying what does not fit."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        why = f"{NOT_MAPPED[model_type]}; " if model_type in NOT_MAPPED else ""
        raise _unsupported(hf_config, f"{why}supported model types: {', '.join(SUPPORTED_MODEL_TYPES)} "
                                      "(their causal LMs and token-classification critics)")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise _unsupported(hf_config, f"hidden_act {hf_config.hidden_act!r}; only SwiGLU (silu) is mapped")
    if model_type in ("llama", "qwen3", "qwen3_moe") and getattr(hf_config, "attention_bias", False):
        raise _unsupported(hf_config, "attention_bias = true (a bias on o_proj too) is not mapped")
    if getattr(hf_config, "mlp_bias", False):
        raise _unsupported(hf_config, "mlp_bias = true is not mapped")
    if getattr(hf_config, "use_sliding_window", False):  # Qwen2's, on the layers past max_window_layers
        raise _unsupported(hf_config, "Qwen2's sliding-window attention (use_sliding_window) is not mapped")
    heads = hf_config.num_attention_heads
    groups = getattr(hf_config, "num_key_value_heads", None) or heads
    if heads % groups:
        raise _unsupported(hf_config, f"{heads} attention heads do not split into {groups} key/value groups")
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return ModelShape(
        model_type=model_type,
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=heads,
        num_query_groups=groups,
        head_dim=head_dim,
        vocab_size=hf_config.vocab_size,
        tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2",
        norm_epsilon=float(hf_config.rms_norm_eps),
        max_position_embeddings=hf_config.max_position_embeddings,
        rope=rope_settings(hf_config),
        initializer_range=float(getattr(hf_config, "initializer_range", 0.02)),
        value_head_bias=bool(getattr(hf_config, "token_classification_bias", True)),
        qk_layernorm=model_type in ("qwen3", "qwen3_moe"),
        experts=_experts(hf_config) if model_type == "qwen3_moe" else None,
        sliding_window=_sliding_window(hf_config) if model_type in ("mistral", "phi3") else None,
        fused_projections=model_type == "phi3",
    )


def _sliding_window(hf_config) -> int | None:
    """Mistral's or Phi-3's window, applied on every layer (None in Mistral v0.2 and later: the whole prefix)."""
    window = getattr(hf_config, "sliding_window", None)
    if window is not None and window < 1:
        raise _unsupported(hf_config, f"sliding_window = {window}; expected a positive number of positions or none")
    return window


def _experts(hf_config) -> Experts:
    """Qwen3-MoE's experts: every layer sparse (``decoder_sparse_step`` 1, no ``mlp_only_layers``)."""
    if getattr(hf_config, "decoder_sparse_step", 1) != 1 or getattr(hf_config, "mlp_only_layers", None):
        raise _unsupported(hf_config, "dense layers between the mixture-of-experts layers (decoder_sparse_step "
                                      f"{hf_config.decoder_sparse_step}, mlp_only_layers {hf_config.mlp_only_layers})"
                                      " are not mapped: every layer must be sparse")
    return Experts(count=hf_config.num_experts, top_k=hf_config.num_experts_per_tok,
                   ffn_hidden_size=hf_config.moe_intermediate_size,
                   norm_top_k=bool(getattr(hf_config, "norm_topk_prob", True)))


def padded_vocab_size(vocab_size: int, tensor_parallel: int) -> int:
    """The vocabulary rounded up to a multiple of the tensor-parallel size (Megatron's vocab-parallel
    embedding splits it evenly). The extra rows are zero and their logits are masked out."""
    return math.ceil(vocab_size / tensor_parallel) * tensor_parallel


def check_parallel_sizes(shape: ModelShape, tensor_parallel: int, pipeline_parallel: int, section: str,
                         expert_parallel: int = 1, expert_tensor_parallel: int | None = None,
                         split: PipelineSplit = PipelineSplit(), context_parallel: int = 1) -> None:
    """Tensor parallelism splits heads, key/value groups and the MLP; pipeline parallelism splits layers;
    expert parallelism splits a mixture of experts' experts (which train without tensor parallelism);
    context parallelism splits each sequence, and its attention each tensor-parallel rank's heads and
    key/value groups."""
    problems = []
    heads, groups = shape.num_attention_heads // tensor_parallel, shape.num_query_groups // tensor_parallel
    if context_parallel > 1 and shape.sliding_window is not None:
        problems.append(f"{section}.context_parallel_size = {context_parallel}: rlcore's context-parallel attention "
                        f"sees the whole causal prefix, and this {shape.model_type} model's attention a sliding "
                        f"window of {shape.sliding_window} positions; train it without context parallelism")
    elif context_parallel > 1 and heads % context_parallel:
        problems.append(f"{section}.context_parallel_size = {context_parallel} does not divide the {heads} attention "
                        f"heads of each of the {tensor_parallel} tensor-parallel ranks ({shape.num_attention_heads} in "
                        "all): rlcore's context-parallel attention gives every rank a whole share of them")
    elif context_parallel > 1 and groups and groups % context_parallel and context_parallel % groups:
        problems.append(f"{section}.context_parallel_size = {context_parallel} neither divides nor is a multiple of "
                        f"the {groups} key/value groups of each of the {tensor_parallel} tensor-parallel ranks "
                        f"({shape.num_query_groups} in all): rlcore's context-parallel attention gives every rank a "
                        "whole share of them, or one group repeated")
    if expert_parallel > 1 and shape.experts is None:
        problems.append(f"{section}.expert_model_parallel_size = {expert_parallel} needs a mixture-of-experts model; "
                        f"this {shape.model_type} model is dense")
    elif shape.experts is not None and shape.experts.count % expert_parallel:
        problems.append(f"{section}.expert_model_parallel_size = {expert_parallel} does not divide the "
                        f"{shape.experts.count} experts")
    if shape.experts is not None and expert_tensor_parallel not in (None, tensor_parallel):
        problems.append(f"{section}.expert_tensor_parallel_size = {expert_tensor_parallel}: rlcore splits each expert "
                        f"over the tensor-parallel ranks like the dense layers ({tensor_parallel}); leave it unset or "
                        "set it to tensor_model_parallel_size")
    if shape.experts is not None and tensor_parallel > 1:
        # megatron-core's MoELayer refuses to train with tensor parallelism but no sequence parallelism
        problems.append(f"{section}.tensor_model_parallel_size = {tensor_parallel}: a mixture of experts under tensor "
                        "parallelism needs megatron-core's sequence parallelism, which its local layer spec (no "
                        "TransformerEngine) lacks; split the experts with expert_model_parallel_size instead")
    mlp = (("expert MLP columns (moe_intermediate_size)", shape.experts.ffn_hidden_size) if shape.experts
           else ("MLP columns (intermediate_size)", shape.ffn_hidden_size))
    for what, count in (("attention heads", shape.num_attention_heads), ("key/value groups", shape.num_query_groups),
                        mlp):
        if count % tensor_parallel:
            problems.append(f"{section}.tensor_model_parallel_size = {tensor_parallel} does not divide the {count} "
                            f"{what}")
    if split == PipelineSplit() and shape.num_layers % pipeline_parallel:
        problems.append(f"{section}.pipeline_model_parallel_size = {pipeline_parallel} does not divide the "
                        f"{shape.num_layers} layers (num_layers_in_first_pipeline_stage and "
                        "num_layers_in_last_pipeline_stage split them unevenly)")
    elif split != PipelineSplit():
        try:
            split.sizes(shape.num_layers, pipeline_parallel)
        except RlcoreError as error:
            keys = "account_for_embedding/loss_in_pipeline_split" if split.embedding or split.loss \
                else "num_layers_in_first/last_pipeline_stage"
            problems.append(f"{section}.{keys}: {error}")
    if problems:
        raise RlcoreError("; ".join(problems))


def transformer_config_kwargs(shape: ModelShape, *, tensor_parallel: int = 1, pipeline_parallel: int = 1,
                              dtype: torch.dtype = torch.bfloat16, gradient_checkpointing: bool = False,
                              recompute: dict[str, Any] | None = None, expert_parallel: int = 1,
                              moe: MoeSettings = MoeSettings(), split: PipelineSplit = PipelineSplit(),
                              context_parallel: int = 1) -> dict[str, Any]:
    """Keyword arguments for ``megatron.core.transformer.TransformerConfig``. Dropout is off (RL
    log-probs must agree between passes) and every fusion that needs TransformerEngine or apex is off
    (the local layer spec runs without them). Sequence parallelism stays off: the local spec's torch
    RMSNorm does not support it."""
    kwargs: dict[str, Any] = {
        "num_layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "ffn_hidden_size": shape.ffn_hidden_size,
        "num_attention_heads": shape.num_attention_heads,
        "num_query_groups": shape.num_query_groups,
        "kv_channels": shape.head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": shape.norm_epsilon,
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": False,
        "add_qkv_bias": shape.qkv_bias,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "init_method_std": shape.initializer_range,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "persist_layer_norm": False,
        "gradient_accumulation_fusion": False,
        "attention_softmax_in_fp32": True,
        "tensor_model_parallel_size": tensor_parallel,
        "pipeline_model_parallel_size": pipeline_parallel,
        # megatron-core's RoPE and loss scaling follow it; rlcore's own attention does the rest
        "context_parallel_size": context_parallel,
        "sequence_parallel": False,
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
        "bf16": dtype == torch.bfloat16,
        "fp16": dtype == torch.float16,
        "variable_seq_lengths": True,  # micro-batches differ in length: stages exchange shapes
        "moe_token_dispatcher_type": "alltoall",  # no MoE here, but the default refuses variable lengths
    }
    kwargs.update(split.kwargs(pipeline_parallel))
    if shape.qk_layernorm:
        kwargs["qk_layernorm"] = True
    if shape.experts is not None:
        kwargs.update(moe_kwargs(shape.experts, expert_parallel, moe))
        if moe.token_dispatcher == "allgather":  # it refuses variable lengths, which only the pipeline's exchange needs
            if pipeline_parallel > 1:
                raise RlcoreError("moe_token_dispatcher_type = 'allgather' (the CPU's) cannot run with pipeline "
                                  "parallelism: it needs fixed sequence lengths; use alltoall")
            kwargs["variable_seq_lengths"] = False
    if recompute is not None:  # [<role>.megatron] recompute_* (verl's override_transformer_config.recompute_*)
        kwargs.update(recompute)
    elif gradient_checkpointing:
        kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    return kwargs


def moe_kwargs(experts: Experts, expert_parallel: int, moe: MoeSettings = MoeSettings()) -> dict[str, Any]:
    """megatron-core's mixture-of-experts settings for transformers' Qwen3-MoE block: a softmax over
    all experts' logits, then the top k (``norm_top_k``: the softmax over the top k logits, which is
    the same as renormalising the chosen probabilities), no token dropped (no capacity factor). By
    default no load-balancing loss: the RL loss is the policy's alone. Each expert is its own SwiGLU
    MLP (megatron-core's local layer spec has no grouped GEMM, which needs TransformerEngine)."""
    balancing = moe.load_balancing or ("aux_loss" if moe.aux_loss_coeff > 0 else "none")
    return {
        "num_moe_experts": experts.count,
        "moe_ffn_hidden_size": experts.ffn_hidden_size,
        "moe_router_topk": experts.top_k,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not experts.norm_top_k,
        "moe_router_load_balancing_type": balancing,
        "moe_aux_loss_coeff": moe.aux_loss_coeff,
        "moe_z_loss_coeff": moe.z_loss_coeff,
        "moe_router_dtype": moe.router_dtype,
        "moe_token_dispatcher_type": moe.token_dispatcher,
        "moe_grouped_gemm": False,
        "expert_model_parallel_size": expert_parallel,
    }


def gpt_model_kwargs(shape: ModelShape, *, tensor_parallel: int = 1, value_head: bool = False) -> dict[str, Any]:
    """Keyword arguments for ``megatron.core.models.gpt.GPTModel`` besides the config, the layer spec
    and the pipeline stage. A critic (``value_head``) never shares its head with the embedding."""
    rope = shape.rope
    return {
        "vocab_size": padded_vocab_size(shape.vocab_size, tensor_parallel),
        "max_sequence_length": shape.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_percent": rope.rotary_percent,
        "rotary_base": rope.theta,
        "rope_scaling": rope.scaling == "llama3",
        "rope_scaling_factor": rope.factor if rope.scaling == "llama3" else 8.0,
        "seq_len_interpolation_factor": rope.factor if rope.scaling == "linear" else None,
        "share_embeddings_and_output_weights": shape.tied_embeddings and not value_head,
        "parallel_output": True,  # vocab-parallel logits; the log-prob code gathers only what it needs
    }
