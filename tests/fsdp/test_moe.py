"""A Hugging Face mixture of experts (a tiny Qwen3-MoE built from its config) on the fsdp backend, 2 CPU
ranks: every weight, experts included, is sharded by FSDP2, which is how rlcore stands in for verl's
expert parallelism (VeOmni's and FSDP-Turbo's ``expert_parallel_size``, ignored with a warning). The
log-probs are transformers' own, and the 2-rank step is the 1-rank step, expert weights included.

The 2-rank run is ``tests/fsdp/moe_ranks.py``; the expected values are computed here, unsharded.
"""

from __future__ import annotations

import pytest
import torch

from rlcore.testing import build_actor
from tests.fsdp import moe_ranks
from tests.fsdp.helpers import make_batch
from tests.fsdp.test_two_ranks import across_ranks, assert_same_step
from tests.fsdp.two_ranks import actor_step, advantages, config
from tests.ranks import run_ranks


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("moe") / "tiny-qwen3-moe", family="qwen3_moe")


@pytest.fixture(scope="module")
def two(moe_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("moe-two-ranks")
    run_ranks("tests.fsdp.moe_ranks", str(moe_path), str(out))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def cpu():
    from rlcore.plugins.manager import get_manager

    return get_manager().get("platforms", "cpu")()


def transformers_log_probs(model_path, batch) -> torch.Tensor:
    """log p(response token) (B, R) from the unsharded model's own forward pass, in fp32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and model.config.num_experts == 4
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    responses = batch["responses"]
    predicting = logits[:, -responses.shape[1] - 1:-1].log_softmax(-1)  # position t predicts token t + 1
    return predicting.gather(-1, responses.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("run", moe_ranks.RUNS, ids=[r[0] for r in moe_ranks.RUNS])
def test_two_ranks_give_transformers_log_probs_of_a_mixture_of_experts(moe_path, two, run):
    batch = make_batch(moe_ranks.ROWS)
    expected = transformers_log_probs(moe_path, batch)
    got = torch.cat([two[0][run[0]]["log_probs"], two[1][run[0]]["log_probs"]])
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("run", moe_ranks.RUNS, ids=[r[0] for r in moe_ranks.RUNS])
def test_two_ranks_train_every_expert_as_one_rank_does(backend, cpu, moe_path, two, run):
    name, actor_settings, packed = run
    expected = actor_step(build_actor(backend, config(moe_path, actor_settings, packed), cpu),
                          make_batch(moe_ranks.ROWS), advantages(moe_ranks.ROWS))
    assert_same_step(across_ranks(two, name), expected)
    from transformers import AutoModelForCausalLM

    initial = dict(AutoModelForCausalLM.from_pretrained(moe_path, dtype=torch.float32).named_parameters())
    experts = [key for key in expected["weights"] if ".mlp.experts." in key or ".mlp.gate." in key]
    assert len(experts) == 6  # per layer: the experts' two fused weights and the router
    for key in experts:
        trained = two[0][name]["weights"][key]
        assert torch.isfinite(trained).all(), key
        for expert, (now, before) in enumerate(zip(trained, initial[key].detach())):  # router: one row each
            assert not torch.equal(now, before), f"{key}: expert {expert} did not train"
