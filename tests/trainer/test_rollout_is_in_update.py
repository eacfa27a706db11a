"""Rollout importance sampling in an on-policy update (one epoch, one mini-batch per step: the colocated
form's default) needs no separate old log-prob pass: the policy before the step's only optimizer step is
the one the update's own forward pass evaluates, so each micro-batch is weighed against its own detached
log-probs. Same loss, gradient and ``rollout_corr/`` metrics as the pass followed by the driver's
correction; a whole in-process step on the tiny model runs it with no ``old_log_prob`` phase."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.algorithms.objective import micro_batch_actor_loss
from rlcore.algorithms.rollout_correction import actor_update_batch, correct_batch
from rlcore.batch import Batch
from rlcore.config import load_job
from rlcore.metrics.step import read_metrics
from rlcore.plugins.manager import get_manager
from rlcore.training.backends import resolve_actor_algorithms
from rlcore.training.specs import actor_spec
from tests.e2e.conftest import gsm8k_parquet, tiny_model  # noqa: F401
from tests.trainer.in_process import first_step, write_length_reward

ON_POLICY_IS = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.calculate_log_probs=true",
                "algorithm.rollout_is_threshold=1.5", "algorithm.rollout_is=true"]


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_weighing_each_micro_batch_equals_the_separate_pass_and_the_drivers_correction(level):
    config = load_job(None, [*ON_POLICY_IS, f"algorithm.rollout_is_level={level}"]).config
    manager = get_manager()
    in_update = actor_spec(config, resolve_actor_algorithms(config, manager, old_log_probs_in_update=True))
    with_pass = actor_spec(config, resolve_actor_algorithms(config, manager))
    generator = torch.Generator().manual_seed(7)
    log_prob = -torch.rand(4, 6, generator=generator) * 3
    spread = 0.4 if level == "token" else 0.15  # stale samples: weights well apart from 1 (1.22 to 1.35 a sequence)
    rollout = log_prob + torch.randn(4, 6, generator=generator) * spread
    advantages = torch.randn(4, 6, generator=generator)
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0  # a shorter response
    entropy = torch.zeros(4, 6)

    ours = log_prob.clone().requires_grad_(True)
    columns = {"response_mask": mask, "advantages": advantages, "rollout_log_probs": rollout}
    loss, metrics = micro_batch_actor_loss(ours, entropy, lambda *keys: [columns[k] for k in keys], in_update,
                                           on_policy=True)
    loss.backward()
    metrics = read_metrics(metrics)  # 0-d tensors, as an update sums them: read as a step reads them

    batch = Batch({"old_log_probs": log_prob, "rollout_log_probs": rollout, "response_mask": mask,
                   "advantages": advantages})
    batch, driver_metrics = correct_batch(batch, config.algorithm, "")
    driver_metrics = read_metrics(driver_metrics)
    batch = actor_update_batch(batch)
    theirs = log_prob.clone().requires_grad_(True)
    loss_then, metrics_then = micro_batch_actor_loss(theirs, entropy, lambda *keys: [batch[k] for k in keys],
                                                     with_pass, on_policy=False)
    loss_then.backward()
    metrics_then = read_metrics(metrics_then)

    assert driver_metrics["rollout_corr/rollout_is_std"] > 0.03
    if level == "token":
        assert driver_metrics["rollout_corr/rollout_is_max"] == pytest.approx(1.5)  # some weights truncated
    torch.testing.assert_close(loss, loss_then, rtol=0, atol=1e-7)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=1e-7)
    for name, value in driver_metrics.items():
        assert metrics[name] == pytest.approx(value, rel=1e-6, abs=1e-7), name
    assert metrics["pg_loss"] == pytest.approx(metrics_then["pg_loss"], abs=1e-7)


def test_an_on_policy_step_with_rollout_is_runs_no_old_log_prob_pass(tiny_model, gsm8k_parquet, tmp_path):
    reward = write_length_reward(tmp_path)  # scores that differ between samples: advantages that are not 0
    common = [*ON_POLICY_IS, f"custom_reward_function.path={reward}"]
    weighed, plan = first_step(tiny_model, gsm8k_parquet, tmp_path / "in-update", *common)
    recomputed, plan_then = first_step(tiny_model, gsm8k_parquet, tmp_path / "pass", *common,
                                       "actor.reuse_on_policy_log_probs=false")
    assert "the rollout correction (algorithm.rollout_is_threshold) weighs each micro-batch" in plan
    assert "a separate pass (actor.reuse_on_policy_log_probs is false)" in plan_then
    assert "timing_s/old_log_prob" not in weighed and "timing_s/old_log_prob" in recomputed
    assert all(math.isfinite(v) for v in weighed.values())
    # the hf engine samples with the actor's weights in fp32: every weight is 1 to ~1e-4 either way
    assert weighed["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
    assert weighed["rollout_corr/rollout_is_mean"] == pytest.approx(recomputed["rollout_corr/rollout_is_mean"], abs=1e-4)
    assert weighed["critic/advantages/max"] > 0.0
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert weighed[name] == pytest.approx(recomputed[name], rel=1e-4, abs=1e-6), name
