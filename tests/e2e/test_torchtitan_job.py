"""A whole GRPO job on the torchtitan backend: a tiny Llama, the hf engine generating with the actor's
weights converted to Hugging Face names, in the job's own process (``trainer.ray = false``)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import job_overrides, read_metrics, train
from tests.torchtitan.conftest import needs_torchtitan, transformers_log_probs

# a few times what the 2-step job took on the idle 2-core machine (about 12 s)
TIMEOUT_S = 90


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama", family="llama")


def test_a_grpo_job_with_kl_loss_trains_validates_and_checkpoints_on_torchtitan(tiny_llama, gsm8k_parquet, tmp_path):
    needs_torchtitan()
    import torch

    from rlcore.api import Batch

    run = tmp_path / "grpo"
    result = train(*job_overrides(tiny_llama, gsm8k_parquet, run), "trainer.backend=torchtitan", "rollout.name=hf",
                   "algorithm.adv_estimator=grpo", "rollout.n=2", "actor.use_kl_loss=true",
                   # k2, 0.5 (log pi - log ref)^2: the default low_var_kl is exactly 0 in fp32 for the tiny
                   # differences of a first update whose rewards are all 0 (a random model on GSM8K)
                   "actor.kl_loss_type=mse", timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reference: on, for actor.use_kl_loss" in result.stdout
    assert "export: none needed:" in result.stdout

    metrics = read_metrics(run)  # every value finite
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for step in metrics[1:]:
        for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean",
                     "timing_s/update_actor", "timing_s/ref"):
            assert name in step, name
        assert step["actor/grad_norm"] > 0 and step["actor/nonfinite_updates"] == 0
    assert metrics[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # step 1: the actor is the reference
    assert metrics[2]["actor/kl_loss"] > 0  # step 2: the first update (weight decay, KL) moved it
    assert "val-core/openai/gsm8k/reward/mean@1" in metrics[2]

    # the step-2 checkpoint's Hugging Face folder is the trained policy: transformers loads it, its
    # weights differ from the initial model's, and its log-probs are a model's (finite, normalised)
    folder = run / "global_step_2" / "actor" / "hf"
    from transformers import AutoModelForCausalLM

    trained = dict(AutoModelForCausalLM.from_pretrained(folder).named_parameters())
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_llama).named_parameters())
    assert trained.keys() == initial.keys()
    assert all(not torch.equal(trained[name], initial[name]) for name in initial)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    rows = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(6)[None],
                  "responses": ids[:, -3:], "response_mask": torch.ones(1, 3, dtype=torch.long)})
    assert torch.isfinite(transformers_log_probs(folder, rows)).all()
