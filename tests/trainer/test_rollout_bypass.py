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
from tests.trainer.in_process import first_step, write_length_reward

TWO_MINI_BATCHES = ["actor.ppo_mini_batch_size=2", "data.train_batch_size=4"]


def test_bypass_takes_the_engines_log_probs_instead_of_an_old_log_prob_pass(tiny_model, gsm8k_parquet, tmp_path):
    bypass, plan = first_step(tiny_model, gsm8k_parquet, tmp_path / "bypass", *TWO_MINI_BATCHES,
                              "algorithm.rollout_bypass=true")
    recomputed, _ = first_step(tiny_model, gsm8k_parquet, tmp_path / "recomputed", *TWO_MINI_BATCHES)
    assert "old log-probs: the rollout engine's own (algorithm.rollout_bypass)" in plan
    assert "timing_s/old_log_prob" not in bypass and "timing_s/old_log_prob" in recomputed
    assert all(math.isfinite(v) for v in bypass.values())
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        assert bypass[name] == pytest.approx(recomputed[name], rel=1e-4, abs=1e-6), name


def test_bypass_needs_the_engines_log_probs():
    with pytest.raises(ConfigError) as info:
        load_job(None, ["algorithm.rollout_bypass=true", "rollout.calculate_log_probs=false",
                        "algorithm.rollout_is_threshold=2.0"])
    assert "rollout.calculate_log_probs must be true" in "\n".join(info.value.problems)


def test_bypass_reinforce_with_sequence_weights_is_the_plain_policy_gradient_when_the_engine_is_the_actor(
        tiny_model, gsm8k_parquet, tmp_path):
    """verl's RLOO example (bypass_mode, loss_type reinforce, rollout_is sequence, batch-normalised): in
    one mini-batch, with the hf engine in fp32 sharing the actor's weights, each weight is 1 and the
    loss is gpg's -A * log pi of the same step."""
    reward = write_length_reward(tmp_path)  # scores that differ between samples: advantages that are not 0
    one_mini_batch = ["actor.ppo_mini_batch_size=4", "data.train_batch_size=4", "rollout.calculate_log_probs=true",
                      f"custom_reward_function.path={reward}"]
    reinforce = ["algorithm.rollout_bypass=true", "algorithm.rollout_bypass_loss=reinforce",
                 "algorithm.rollout_is_threshold=2.0", "algorithm.rollout_is=true", "algorithm.rollout_is_level=sequence",
                 "algorithm.rollout_is_batch_normalize=true", "algorithm.rollout_rs_criteria={seq_max_k2 = 2.5}"]
    corrected, plan = first_step(tiny_model, gsm8k_parquet, tmp_path / "bypass", *one_mini_batch, *reinforce)
    gradient, _ = first_step(tiny_model, gsm8k_parquet, tmp_path / "gpg", *one_mini_batch, "actor.policy_loss=gpg")
    assert "old log-probs: the rollout engine's own (algorithm.rollout_bypass)" in plan
    assert all(math.isfinite(v) for v in corrected.values())
    assert corrected["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
    assert corrected["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    # the engine's fp32 log-probs match the actor's to ~1e-5 a token, so the weights are 1 to ~1e-4, and the
    # loss, a small difference of -A * log pi terms of size ~6, matches gpg's to ~1e-5
    assert corrected["rollout_corr/rollout_is_max"] == pytest.approx(1.0, abs=1e-3)
    assert corrected["actor/pg_loss"] == pytest.approx(gradient["actor/pg_loss"], abs=1e-5)
    assert corrected["critic/advantages/max"] > 0.0 and corrected["actor/pg_loss"] != 0.0
