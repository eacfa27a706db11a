"""Weights between Hugging Face and Megatron on plain tensors: names, fused layouts, tensor-parallel
shards, pipeline stages. Runs everywhere (no megatron-core needed)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    LlamaConfig,
    Phi3Config,
    Qwen2Config,
)

from rlcore.errors import RlcoreError
from rlcore_megatron.config_map import model_shape
from rlcore_megatron.weights import (
    EMBEDDING,
    OUTPUT,
    fuse_qkv,
    hf_tensors,
    hf_to_megatron,
    local_name,
    megatron_tensor,
    megatron_to_hf,
    split_qkv,
    stage_layers,
    stage_names,
    tp_merge,
    tp_shard,
)

SMALL = {"vocab_size": 250, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 256}
CONFIGS = {
    "qwen2-tied": lambda: Qwen2Config(**SMALL, tie_word_embeddings=True),
    "qwen2-untied": lambda: Qwen2Config(**SMALL, tie_word_embeddings=False),
    "llama-untied-mha": lambda: LlamaConfig(**{**SMALL, "num_key_value_heads": 4}, tie_word_embeddings=False),
    "llama-tied": lambda: LlamaConfig(**SMALL, tie_word_embeddings=True),
    "phi3-fused-projections": lambda: Phi3Config(**SMALL, tie_word_embeddings=False, pad_token_id=0),
}


def hf_state(config, value_head: bool = False) -> dict[str, torch.Tensor]:
    """A tiny model's state dict with every tensor random (norms and biases too), tied ones once."""
    torch.manual_seed(0)
    if value_head:
        config.num_labels = 1
        model = AutoModelForTokenClassification.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
    state = {name: torch.randn_like(p) for name, p in model.named_parameters()}  # tied weights come once
    return state


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("tp", [1, 2])
def test_hf_to_megatron_and_back_is_exact_through_tensor_parallel_shards(name, tp):
    config = CONFIGS[name]()
    shape = model_shape(config)
    hf = hf_state(config)
    megatron = hf_to_megatron(hf, shape, tensor_parallel=tp)
    assert set(megatron) == set(stage_names(shape))
    merged = {key: tp_merge(key, [tp_shard(key, full, tp, rank) for rank in range(tp)])
              for key, full in megatron.items()}
    back = megatron_to_hf(merged, shape)
    assert set(back) == set(hf) and all(torch.equal(back[key], hf[key]) for key in hf)


def test_a_critic_head_converts_both_ways_and_is_replicated():
    config = CONFIGS["qwen2-tied"]()
    shape = model_shape(config)
    hf = hf_state(config, value_head=True)
    assert {"score.weight", "score.bias"} <= set(hf) and "lm_head.weight" not in hf
    megatron = hf_to_megatron(hf, shape, tensor_parallel=2, value_head=True)
    assert megatron[OUTPUT].shape == (1, 32) and megatron["output_layer.bias"].shape == (1,)
    assert torch.equal(tp_shard(OUTPUT, megatron[OUTPUT], 2, 1, value_head=True), megatron[OUTPUT])
    back = megatron_to_hf(megatron, shape, value_head=True)
    assert set(back) == set(hf) and all(torch.equal(back[key], hf[key]) for key in hf)


def test_grouped_query_attention_is_interleaved_per_query_group():
    """4 query heads in 2 groups, head_dim 1: rows q0 q1 k0 v0 | q2 q3 k1 v1, and TP 2 gives each rank
    one whole group."""
    shape = model_shape(Qwen2Config(vocab_size=8, hidden_size=4, intermediate_size=4, num_hidden_layers=1,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=1))
    q = torch.tensor([[10.0], [11.0], [12.0], [13.0]])
    k = torch.tensor([[20.0], [21.0]])
    v = torch.tensor([[30.0], [31.0]])
    fused = fuse_qkv(q, k, v, shape)
    assert fused.flatten().tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    name = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert tp_shard(name, fused, 2, 0).flatten().tolist() == [10, 11, 20, 30]
    assert tp_shard(name, fused, 2, 1).flatten().tolist() == [12, 13, 21, 31]
    assert [t.flatten().tolist() for t in split_qkv(tp_shard(name, fused, 2, 1), shape, groups=1)] == \
        [[12, 13], [21], [31]]
    bias = fuse_qkv(q[:, 0], k[:, 0], v[:, 0], shape)  # 1-D biases interleave the same way
    assert bias.tolist() == [10, 11, 20, 30, 12, 13, 21, 31]


def test_fc1_shards_hold_their_gate_rows_over_their_up_rows():
    gate, up = torch.arange(4.0)[:, None], torch.arange(10.0, 14.0)[:, None]
    name = "decoder.layers.3.mlp.linear_fc1.weight"
    full = torch.cat([gate, up])
    shards = [tp_shard(name, full, 2, rank) for rank in range(2)]
    assert [s.flatten().tolist() for s in shards] == [[0, 1, 10, 11], [2, 3, 12, 13]]
    assert torch.equal(tp_merge(name, shards), full)


def test_row_parallel_layers_split_their_input_columns_and_norms_are_replicated():
    full = torch.arange(12.0).reshape(2, 6)
    proj = "decoder.layers.0.self_attention.linear_proj.weight"
    assert tp_shard(proj, full, 3, 1).tolist() == [[2, 3], [8, 9]]
    norm = "decoder.layers.0.input_layernorm.weight"
    assert torch.equal(tp_shard(norm, torch.ones(6), 3, 2), torch.ones(6))


def test_a_padded_vocabulary_is_zero_padded_and_cut_off_again():
    config = Qwen2Config(**{**SMALL, "vocab_size": 251}, tie_word_embeddings=False)
    shape = model_shape(config)
    hf = hf_state(config)
    megatron = hf_to_megatron(hf, shape, tensor_parallel=2)
    assert megatron[EMBEDDING].shape == (252, 32) and megatron[OUTPUT].shape == (252, 32)
    assert not megatron[EMBEDDING][251:].any()
    assert torch.equal(dict(hf_tensors(EMBEDDING, megatron[EMBEDDING], shape))["model.embed_tokens.weight"],
                       hf["model.embed_tokens.weight"])


def test_two_pipeline_stages_split_the_layers_and_the_last_holds_the_head():
    shape = model_shape(CONFIGS["qwen2-tied"]())
    assert [list(stage_layers(4, 2, stage)) for stage in range(2)] == [[0, 1], [2, 3]]
    first, last = stage_names(shape, 2, 0), stage_names(shape, 2, 1)
    assert first[0] == EMBEDDING and OUTPUT not in first and "decoder.final_layernorm.weight" not in first
    assert {n.split(".")[2] for n in first if n.startswith("decoder.layers.")} == {"0", "1"}
    assert {n.split(".")[2] for n in last if n.startswith("decoder.layers.")} == {"2", "3"}
    # tied: the last stage keeps its own copy of the embedding as the output layer; one stage has none
    assert last[-2:] == ["decoder.final_layernorm.weight", OUTPUT] and EMBEDDING not in last
    assert OUTPUT not in stage_names(shape, 1, 0)
    assert local_name("decoder.layers.3.mlp.linear_fc2.weight", 2) == "decoder.layers.1.mlp.linear_fc2.weight"
    # a tied head is the embedding: converting it gives nothing, so the embedding is sent once
    assert hf_tensors(OUTPUT, torch.zeros(250, 32), shape) == []
    hf = hf_state(CONFIGS["qwen2-tied"]())
    stages = [hf_to_megatron(hf, shape, pipeline_parallel=2, stage=s) for s in range(2)]
    assert torch.equal(stages[1][OUTPUT], hf["model.embed_tokens.weight"])
    back = megatron_to_hf({**stages[0], **stages[1]}, shape)
    assert set(back) == set(hf) and all(torch.equal(back[key], hf[key]) for key in hf)


def test_phi3s_stacked_qkv_is_unstacked_and_interleaved_per_query_group():
    """Phi-3 keeps all query rows, then the key rows, then the value rows in one qkv_proj; Megatron's
    fused rows are the same as from separate q_proj, k_proj and v_proj."""
    phi3 = model_shape(Phi3Config(**SMALL, tie_word_embeddings=False))
    llama = model_shape(LlamaConfig(**SMALL, tie_word_embeddings=False))
    q, k, v = torch.randn(32, 32), torch.randn(16, 32), torch.randn(16, 32)
    name = "decoder.layers.0.self_attention.linear_qkv.weight"
    separate = {"model.layers.0.self_attn.q_proj.weight": q, "model.layers.0.self_attn.k_proj.weight": k,
                "model.layers.0.self_attn.v_proj.weight": v}
    stacked = {"model.layers.0.self_attn.qkv_proj.weight": torch.cat([q, k, v])}
    assert torch.equal(megatron_tensor(name, stacked.__getitem__, phi3),
                       megatron_tensor(name, separate.__getitem__, llama))
    with pytest.raises(RlcoreError, match="a qkv_proj of 63 rows does not hold 4 query and 2 x 2 key/value heads"):
        megatron_tensor(name, {"model.layers.0.self_attn.qkv_proj.weight": torch.randn(63, 32)}.__getitem__, phi3)
