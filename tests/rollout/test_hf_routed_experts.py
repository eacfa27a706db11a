"""The ``hf`` rollout engine's ``routed_experts`` (rollout.return_routed_experts) on a tiny Qwen3-MoE: the
experts its routers chose while generating (prompt forward, then one token per step with the KV cache) are
those of one full forward of prompt + response on the same weights, and the column is laid out as the
contract says (-1 at pads and at each response's last token)."""

from __future__ import annotations

import pytest
import torch

from rlcore.batch import Batch
from rlcore.models.loading import load_tokenizer
from rlcore.models.routing import ModelRouting, column_of, recorded_tokens
from rlcore.testing import build_actor
from rlcore.training.roles import SamplingParams
from tests.fsdp.helpers import job
from tests.rollout.test_hf import QUESTIONS, engine_for


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("moe") / "tiny-qwen3-moe", family="qwen3_moe")


def moe_prompts(model_path) -> Batch:
    encoded = load_tokenizer(str(model_path))(QUESTIONS, return_tensors="pt", padding=True, padding_side="left")
    assert encoded["attention_mask"][:, 0].min() == 0  # some rows are padded
    return Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


@pytest.mark.parametrize("sampling", [SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=10),
                                      SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=3)],
                         ids=["greedy", "sampled"])
def test_the_engines_routing_is_that_of_a_full_forward_of_prompt_and_response(backend, platform, moe_path, sampling):
    config = job(moe_path, rollout={"return_routed_experts": True})
    actor = build_actor(backend, config, platform)
    out = engine_for(actor, config, platform).generate(moe_prompts(moe_path), sampling)
    column = out["routed_experts"]
    rows, width = out["input_ids"].shape
    assert column.shape == (rows, width, 2, 2) and column.dtype == torch.int16
    mask = out["attention_mask"].bool()
    assert (column[~mask] == -1).all()
    lengths = out["response_mask"].sum(-1)
    prompt_width = out["prompts"].shape[1]
    for row in range(rows):  # the last response token is sampled and never forwarded
        last = prompt_width + int(lengths[row]) - 1
        assert (column[row, last] == -1).all() and (column[row, :last][mask[row, :last]] >= 0).all()

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_path, dtype=torch.float32)
    routing = ModelRouting(model)
    with torch.no_grad(), routing.recording() as records:
        model(input_ids=out["input_ids"], attention_mask=out["attention_mask"], position_ids=out["position_ids"])
    full = column_of(recorded_tokens(records), out["attention_mask"], packed=False)
    defined = (column >= 0).all(-1)  # (B, T, L)
    assert defined.sum() > 0.8 * (mask.sum() - rows) * 2
    assert torch.equal(column[defined], full[defined])


def test_without_the_setting_the_engine_returns_no_routing_and_leaves_no_hooks(backend, platform, moe_path):
    config = job(moe_path)
    actor = build_actor(backend, config, platform)
    out = engine_for(actor, config, platform).generate(moe_prompts(moe_path), SamplingParams(
        n=1, do_sample=False, temperature=0.0, max_new_tokens=4))
    assert "routed_experts" not in out
    on = job(moe_path, rollout={"return_routed_experts": True})
    engine_for(actor, on, platform).generate(moe_prompts(moe_path), SamplingParams(
        n=1, do_sample=False, temperature=0.0, max_new_tokens=4))
    routers = [m for m in actor.module.modules() if type(m).__name__ == "Qwen3MoeTopKRouter"]
    assert len(routers) == 2 and not any(router._forward_hooks for router in routers)  # the borrowed module as lent
