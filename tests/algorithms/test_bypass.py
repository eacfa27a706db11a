"""verl's bypass mode with rollout correction: weights and rejections computed in the loss, against
the policy being trained, for the REINFORCE loss and for PPO-clip; worked by hand."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from rlcore.algorithms.bypass import BypassCorrection, bypass_policy_loss
from rlcore.algorithms.policy_losses import vanilla
from rlcore.config.schema import ActorConfig, AlgorithmConfig

LOG2 = math.log(2.0)
# the policy being trained: log pi_theta; log r = log(pi_theta / pi_rollout) is ln2, ln2 | -ln2, 0
LOG_PROB = [[-1.0, -2.0], [-0.5, -1.5]]
LOG_RATIO = torch.tensor([[LOG2, LOG2], [-LOG2, 0.0]])
ROLLOUT = torch.tensor(LOG_PROB) - LOG_RATIO  # in bypass mode the old log-probs are the engine's
ADVANTAGES = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
MASK = torch.ones(2, 2, dtype=torch.long)
ACTOR = ActorConfig(loss_agg_mode="token-mean")


def bypass(**settings) -> BypassCorrection:
    return BypassCorrection(vanilla, AlgorithmConfig(rollout_bypass=True, rollout_is_threshold=2.0, **settings))


def test_reinforce_weighs_each_sequence_by_its_truncated_normalised_ratio():
    # sequence ratios: 2 * 2 = 4, truncated at 2; 1/2 * 1 = 1/2. Their mean 1.25 normalises them to 1.6 and 0.4.
    # per token -A * w * log pi: 1.6, 3.2 | -0.2, -0.6; token-mean 4 / 4 = 1; d loss / d log pi = -A * w / 4
    log_prob = torch.tensor(LOG_PROB, requires_grad=True)
    loss = bypass(rollout_bypass_loss="reinforce", rollout_is=True, rollout_is_level="sequence",
                  rollout_is_batch_normalize=True)
    output = loss(ROLLOUT, log_prob, ADVANTAGES, MASK, ACTOR)
    assert float(output.loss.detach()) == pytest.approx(1.0, rel=1e-5)
    output.loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.4, -0.4], [0.1, 0.1]]))
    assert output.metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.25)
    assert output.metrics["ppo_kl"] == pytest.approx(-LOG2 / 4)  # mean of log pi_rollout - log pi_theta
    assert output.metrics["pg_loss"] == pytest.approx(1.0, rel=1e-5)


def test_reinforce_without_weights_is_the_plain_policy_gradient():
    log_prob = torch.tensor(LOG_PROB, requires_grad=True)
    loss = BypassCorrection(vanilla, AlgorithmConfig(rollout_bypass=True, rollout_bypass_loss="reinforce"))
    output = loss(ROLLOUT, log_prob, ADVANTAGES, MASK, ACTOR)
    assert float(output.loss.detach()) == pytest.approx((1 + 2 - 0.5 - 1.5) / 4)  # -A * log pi, token-mean
    assert not any(key.startswith("rollout_corr/") for key in output.metrics)


def test_ppo_clip_logs_the_weights_applies_only_the_rejections():
    # token_k1 keeps 1/r in [0.4, 1.6]: 1/r = 1/2, 1/2 | 2, 1 -> the third token leaves. PPO-clip (0.2) on the
    # ratio pi_theta / pi_rollout: r = 2 with A = 1 gives max(-2, -1.2) = -1.2, twice; r = 1 with A = -1 gives 1.
    # token-mean over the 3 kept: -1.4 / 3 (the weights, 2 on the first row, would double its part)
    log_prob = torch.tensor(LOG_PROB, requires_grad=True)
    loss = bypass(rollout_is=True, rollout_is_level="token", rollout_rs_criteria={"token_k1": [0.4, 1.6]})
    output = loss(ROLLOUT, log_prob, ADVANTAGES, MASK, ACTOR)
    assert float(output.loss.detach()) == pytest.approx(-1.4 / 3, rel=1e-5)
    kept = torch.tensor([[1, 1], [0, 1]])
    assert float(output.loss.detach()) == pytest.approx(float(vanilla(ROLLOUT, log_prob, ADVANTAGES, kept, ACTOR).loss.detach()))
    assert output.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.25)
    assert output.metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)  # logged, not applied
    assert output.metrics["pg_clipfrac"] == pytest.approx(2 / 3)


def test_the_wrapper_is_used_only_in_bypass_mode_with_a_correction_and_pickles():
    assert bypass_policy_loss(AlgorithmConfig(rollout_is_threshold=2.0), vanilla) is vanilla
    assert bypass_policy_loss(AlgorithmConfig(rollout_bypass=True), vanilla) is vanilla
    wrapped = bypass_policy_loss(AlgorithmConfig(rollout_bypass=True, rollout_bypass_loss="reinforce"), vanilla)
    assert isinstance(wrapped, BypassCorrection)
    assert pickle.loads(pickle.dumps(wrapped)) == wrapped  # it travels to the workers with ActorAlgorithms
