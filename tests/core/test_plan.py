"""Which passes a step runs: the old log-prob pass only where the update is not on-policy."""

from __future__ import annotations

import pytest

from rlcore.config import load_job
from rlcore.plugins.manager import get_manager
from rlcore.workers.plan import plan_roles


def plan(*overrides: str):
    base = ["data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=2"]
    return plan_roles(load_job(None, [*base, *overrides]).config, get_manager())


def test_an_on_policy_update_needs_no_old_log_prob_pass():
    roles = plan()
    assert not roles.old_log_prob_pass
    assert "old log-probs: from the update's own forward pass" in roles.describe()


@pytest.mark.parametrize("override, reason", [
    ("actor.ppo_epochs=2", "actor.ppo_epochs = 2"),
    ("actor.ppo_mini_batch_size=4", "actor.ppo_mini_batch_size = 4 < data.train_batch_size = 8"),
    ("algorithm.rollout_is_threshold=2.0 algorithm.rollout_is_batch_normalize=true",
     "algorithm.rollout_is_threshold: algorithm.rollout_is_batch_normalize averages the weights over the batch"),
    ("algorithm.rollout_is_threshold=2.0 algorithm.rollout_is_mode=mask",
     "algorithm.rollout_is_threshold: algorithm.rollout_is_mode = 'mask' rejects tokens"),
    ("algorithm.use_kl_in_reward=true", "algorithm.use_kl_in_reward"),
    ("actor.reuse_on_policy_log_probs=false", "actor.reuse_on_policy_log_probs is false"),
    ("actor.calculate_sum_pi_squared=true", "actor.calculate_sum_pi_squared: the pass computes it"),
    ("actor.router_replay=R2", "actor.router_replay = 'R2' replays the routing the pass records"),
])
def test_anything_off_policy_keeps_the_separate_pass(override, reason):
    roles = plan(*override.split())
    assert roles.old_log_prob_pass
    assert reason in roles.describe()


def test_truncated_rollout_weights_are_taken_against_the_updates_own_forward_pass():
    """Rollout IS in an on-policy update (the colocated form's default): the weights pi_old / pi_rollout of
    each micro-batch come from the update's own forward pass (the policy before its only optimizer step),
    with no separate pass; the driver leaves the correction to the actor."""
    roles = plan("algorithm.rollout_is_threshold=2.0", "algorithm.rollout_is=true", "rollout.calculate_log_probs=true")
    assert not roles.old_log_prob_pass
    assert ("old log-probs: from the update's own forward pass (on-policy: one epoch, one mini-batch per step); the "
            "rollout correction (algorithm.rollout_is_threshold) weighs each micro-batch against them") in roles.describe()
    assert roles.actor_algorithms.rollout_correction.rollout_is_threshold == 2.0
    assert plan().actor_algorithms.rollout_correction is None
    with_pass = plan("algorithm.rollout_is_threshold=2.0", "actor.ppo_epochs=2")
    assert with_pass.old_log_prob_pass and with_pass.actor_algorithms.rollout_correction is None
