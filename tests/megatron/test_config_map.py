"""Hugging Face configs -> megatron-core TransformerConfig / GPTModel arguments, and which model families
(tests/families.py) the mapping builds or refuses. Pure Python: runs everywhere (main and megatron envs)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import Gemma2Config, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config

from rlcore.errors import RlcoreError
from rlcore.testing import build_tiny_tokenizer
from rlcore_megatron.config_map import (
    NOT_MAPPED,
    Rope,
    check_parallel_sizes,
    gpt_model_kwargs,
    model_shape,
    padded_vocab_size,
    transformer_config_kwargs,
)
from tests.families import FAMILIES, MEGATRON_MAPPED, family_config

SMALL = {"vocab_size": 500, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 8,
             "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}


@pytest.mark.parametrize("tied", [False, True])
def test_a_tiny_qwen2_maps_to_grouped_query_attention_with_qkv_bias(tied):
    shape = model_shape(Qwen2Config(**SMALL, tie_word_embeddings=tied, rope_theta=1e6))
    kwargs = transformer_config_kwargs(shape, tensor_parallel=2, pipeline_parallel=2, dtype=torch.bfloat16,
                                       gradient_checkpointing=True)
    assert {k: kwargs[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                   "num_query_groups", "kv_channels", "normalization", "layernorm_epsilon",
                                   "gated_linear_unit", "add_bias_linear", "add_qkv_bias",
                                   "tensor_model_parallel_size", "pipeline_model_parallel_size", "bf16",
                                   "params_dtype", "hidden_dropout", "attention_dropout",
                                   "recompute_granularity")} == {
        "num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 8, "num_query_groups": 2,
        "kv_channels": 8, "normalization": "RMSNorm", "layernorm_epsilon": 1e-5, "gated_linear_unit": True,
        "add_bias_linear": False, "add_qkv_bias": True, "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2, "bf16": True, "params_dtype": torch.bfloat16, "hidden_dropout": 0.0,
        "attention_dropout": 0.0, "recompute_granularity": "full"}
    assert kwargs["activation_func"] is torch.nn.functional.silu  # SwiGLU = gated silu
    model = gpt_model_kwargs(shape, tensor_parallel=4)
    assert model["share_embeddings_and_output_weights"] is tied
    assert (model["vocab_size"], model["rotary_base"], model["position_embedding_type"]) == (500, 1e6, "rope")
    assert model["rope_scaling"] is False and model["seq_len_interpolation_factor"] is None
    assert gpt_model_kwargs(shape, value_head=True)["share_embeddings_and_output_weights"] is False


@pytest.mark.parametrize("tied", [False, True])
def test_a_tiny_llama_maps_without_bias_and_with_its_head_dim(tied):
    shape = model_shape(LlamaConfig(**SMALL, tie_word_embeddings=tied, head_dim=16))
    assert (shape.qkv_bias, shape.head_dim, shape.tied_embeddings, shape.heads_per_group) == (False, 16, tied, 4)
    kwargs = transformer_config_kwargs(shape, dtype=torch.float32)
    assert (kwargs["add_qkv_bias"], kwargs["kv_channels"], kwargs["bf16"], kwargs["fp16"]) == (False, 16, False, False)
    assert "recompute_granularity" not in kwargs
    assert gpt_model_kwargs(shape)["share_embeddings_and_output_weights"] is tied


def test_rope_scaling_llama3_and_linear_map_onto_megatrons_settings():
    llama3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
    shape = model_shape(LlamaConfig(**{**SMALL, "max_position_embeddings": 131072}, rope_scaling=llama3,
                                    rope_theta=500000.0))
    assert shape.rope == Rope(theta=500000.0, scaling="llama3", factor=32.0)
    model = gpt_model_kwargs(shape)
    assert (model["rope_scaling"], model["rope_scaling_factor"], model["rotary_base"]) == (True, 32.0, 500000.0)
    linear = model_shape(LlamaConfig(**SMALL, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    assert gpt_model_kwargs(linear)["seq_len_interpolation_factor"] == 2.0
    with pytest.raises(RlcoreError, match="Llama-3 RoPE scaling with .*only the factor"):
        model_shape(LlamaConfig(**{**SMALL, "max_position_embeddings": 131072},
                                rope_scaling={**llama3, "high_freq_factor": 2.0}))
    with pytest.raises(RlcoreError, match="RoPE scaling 'dynamic'; supported: default, linear, llama3"):
        model_shape(LlamaConfig(**SMALL, rope_scaling={"rope_type": "dynamic", "factor": 2.0}))


def test_rope_settings_from_transformers_4_attributes():
    fields = {**Qwen2Config(**SMALL).to_dict(), "rope_parameters": None, "rope_theta": 1234.0, "rope_scaling": None}
    assert model_shape(SimpleNamespace(**fields)).rope == Rope(theta=1234.0)
    fields["rope_scaling"] = {"type": "linear", "factor": 4.0}
    assert model_shape(SimpleNamespace(**fields)).rope == Rope(theta=1234.0, scaling="linear", factor=4.0)


def test_unsupported_models_name_their_type_and_architectures():
    gemma2 = Gemma2Config(**SMALL, architectures=["Gemma2ForCausalLM"])
    with pytest.raises(RlcoreError, match=r"model_type 'gemma2', architectures \['Gemma2ForCausalLM'\].*"
                                          r"supported model types: llama, mistral, phi3, qwen2"):
        model_shape(gemma2)
    with pytest.raises(RlcoreError, match="hidden_act 'gelu'"):
        model_shape(LlamaConfig(**SMALL, hidden_act="gelu"))
    with pytest.raises(RlcoreError, match="attention_bias"):
        model_shape(LlamaConfig(**SMALL, attention_bias=True))
    with pytest.raises(RlcoreError, match="sliding-window"):
        model_shape(Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=128))


def test_parallel_sizes_must_divide_heads_groups_mlp_and_layers():
    shape = model_shape(Qwen2Config(**SMALL))
    check_parallel_sizes(shape, 2, 4, "actor.megatron")
    with pytest.raises(RlcoreError) as error:
        check_parallel_sizes(shape, 4, 3, "actor.megatron")
    message = str(error.value)
    assert "actor.megatron.tensor_model_parallel_size = 4 does not divide the 2 key/value groups" in message
    assert "actor.megatron.pipeline_model_parallel_size = 3 does not divide the 4 layers" in message


def test_the_vocabulary_is_padded_to_a_multiple_of_the_tensor_parallel_size():
    assert [padded_vocab_size(500, tp) for tp in (1, 2, 3, 8)] == [500, 500, 501, 504]


# -- the model families (tests/families.py): which the mapping builds, which it refuses and why -------------
LLAMA_3_1_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# family -> what the refusal says besides the model_type and the supported types
REFUSED_FAMILIES = {
    "gemma2": "soft-capping",
    "deepseek_v3": "multi-head latent attention",
}


def test_every_family_is_mapped_or_refused():
    assert sorted(MEGATRON_MAPPED + list(REFUSED_FAMILIES)) == sorted(FAMILIES)
    assert set(REFUSED_FAMILIES) <= set(NOT_MAPPED)


@pytest.mark.parametrize("family", MEGATRON_MAPPED)
def test_a_family_megatron_core_builds_maps_onto_its_settings(family):
    settings = {"rope_parameters": LLAMA_3_1_ROPE} if family == "llama" else {}
    config = family_config(family, build_tiny_tokenizer(), **settings)
    shape = model_shape(config)
    kwargs = transformer_config_kwargs(shape, dtype=torch.float32)
    assert shape.model_type == family
    assert (kwargs["num_layers"], kwargs["hidden_size"], kwargs["num_attention_heads"], kwargs["num_query_groups"],
            kwargs["kv_channels"]) == (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                                       config.num_key_value_heads, config.hidden_size // config.num_attention_heads)
    assert kwargs["add_qkv_bias"] is (family == "qwen2")
    assert kwargs.get("qk_layernorm", False) is family.startswith("qwen3")
    assert kwargs.get("num_moe_experts") == (4 if family == "qwen3_moe" else None)
    model = gpt_model_kwargs(shape)
    assert model["share_embeddings_and_output_weights"] is config.tie_word_embeddings
    if family == "llama":
        assert (model["rope_scaling"], model["rope_scaling_factor"], model["rotary_base"]) == (True, 8.0, 500000.0)
    assert shape.sliding_window == (config.sliding_window if family in ("mistral", "phi3") else None)
    assert shape.fused_projections is (family == "phi3")


def test_the_family_llamas_own_rope_band_is_refused_as_megatron_core_fixes_it():
    """The family's tiny Llama slows wavelengths from 16 positions on (original_max_position_embeddings
    16, so that the scaling matters at 14 tokens); megatron-core fixes Llama 3.1's 8192."""
    with pytest.raises(RlcoreError, match=r"model_type 'llama'.*Llama-3 RoPE scaling with .*"
                                          r"'original_max_position_embeddings': 16\.0.*only the factor"):
        model_shape(family_config("llama", build_tiny_tokenizer()))


@pytest.mark.parametrize("family", list(REFUSED_FAMILIES))
def test_a_family_megatron_core_does_not_build_is_refused_with_its_reason(family):
    config = family_config(family, build_tiny_tokenizer())
    with pytest.raises(RlcoreError, match=rf"trainer.backend = 'megatron' cannot build this model \(model_type "
                                          rf"'{family}'.*\): .*{REFUSED_FAMILIES[family]}.*; supported model types: "
                                          r"llama, mistral, phi3, qwen2, qwen3, qwen3_moe"):
        model_shape(config)


# -- Mistral's sliding window ---------------------------------------------------------------------------
def test_mistral_keeps_its_window_and_a_mistral_without_one_sees_the_whole_prefix():
    assert model_shape(MistralConfig(**SMALL, sliding_window=4096)).sliding_window == 4096
    assert model_shape(MistralConfig(**SMALL, sliding_window=None)).sliding_window is None  # v0.2 and later
    with pytest.raises(RlcoreError, match="sliding_window = 0; expected a positive number"):
        model_shape(MistralConfig(**SMALL, sliding_window=0))


@pytest.mark.parametrize("window", [None, 1, 3, 4, 20])
def test_the_attention_mask_hides_what_transformers_sliding_window_mask_hides(window):
    """rlcore's mask (True: hidden) against transformers' own mask functions (True: seen), position by
    position, over 12 positions."""
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    from rlcore_megatron.compute import attention_mask

    seen = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    length = 12
    zero, index = torch.tensor(0), torch.tensor
    expected = torch.tensor([[not bool(seen(zero, zero, index(q), index(k))) for k in range(length)]
                             for q in range(length)])
    assert torch.equal(attention_mask(length, torch.device("cpu"), window)[0, 0], expected)


def test_context_parallelism_is_refused_for_a_sliding_window_naming_both():
    shape = model_shape(MistralConfig(**SMALL, sliding_window=8))
    with pytest.raises(RlcoreError, match=r"actor.megatron.context_parallel_size = 2: rlcore's context-parallel "
                                          r"attention sees the whole causal prefix, and this mistral model's "
                                          r"attention a sliding window of 8 positions"):
        check_parallel_sizes(shape, 1, 1, "actor.megatron", context_parallel=2)
    check_parallel_sizes(model_shape(MistralConfig(**SMALL, sliding_window=None)), 1, 1, "actor.megatron",
                         context_parallel=2)


def test_phi3_maps_its_window_and_partial_rotary_and_refuses_longrope():
    shape = model_shape(Phi3Config(**SMALL, sliding_window=2047, partial_rotary_factor=0.75))
    assert (shape.sliding_window, shape.rope.rotary_percent, shape.fused_projections) == (2047, 0.75, True)
    longrope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                "original_max_position_embeddings": 1024}
    with pytest.raises(RlcoreError, match="model_type 'phi3'.*RoPE scaling 'longrope'; supported: default, linear"):
        model_shape(Phi3Config(**SMALL, rope_parameters=longrope))
