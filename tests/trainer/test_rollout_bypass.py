"""verl's rollout-correction bypass mode (``algorithm.rollout_bypass``): the rollout engine's
log-probs are the old policy's, so a step that would need an old log-prob pass (two mini-batches)
runs without one. With the hf engine in fp32 sharing the actor's weights, the engine's log-probs
are the actor's, so the step's losses equal the same step with the pass."""

from __future__ import annotations

import math

import pytest

from rlcore.config import load_job
from rlcore.errors import ConfigError
from tests.e2e.conftest import gsm8k_parquet, tiny_model  # noqa: F401
from tests.trainer.test_step_in_process import in_process_trainer

TWO_MINI_BATCHES = ["actor.ppo_mini_batch_size=2", "data.train_batch_size=4"]


def one_step(tiny_model, gsm8k_parquet, run_dir, *extra) -> tuple[dict, str]:
    trainer = in_process_trainer(tiny_model, gsm8k_parquet, run_dir, *TWO_MINI_BATCHES, *extra)
    try:
        trainer.global_step = 1
        return trainer.step(), trainer.plan.describe()
    finally:
        trainer.reward.close()
        trainer.workers.shutdown()


def test_bypass_takes_the_engines_log_probs_instead_of_an_old_log_prob_pass(tiny_model, gsm8k_parquet, tmp_path):
    bypass, plan = one_step(tiny_model, gsm8k_parquet, tmp_path / "bypass", "algorithm.rollout_bypass=true")
    recomputed, _ = one_step(tiny_model, gsm8k_parquet, tmp_path / "recomputed")
    assert "old log-probs: the rollout engine's own (algorithm.rollout_bypass)" in plan
    assert "timing_s/old_log_prob" not in bypass and "timing_s/old_log_prob" in recomputed
    assert all(math.isfinite(v) for v in bypass.values())
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        assert bypass[name] == pytest.approx(recomputed[name], rel=1e-4, abs=1e-6), name


def test_bypass_needs_the_engines_log_probs_and_no_importance_weights():
    with pytest.raises(ConfigError) as info:
        load_job(None, ["algorithm.rollout_bypass=true", "rollout.calculate_log_probs=false",
                        "algorithm.rollout_is_threshold=2.0"])
    problems = "\n".join(info.value.problems)
    assert "rollout.calculate_log_probs must be true" in problems
    assert "unset algorithm.rollout_is_threshold, or leave bypass off" in problems
