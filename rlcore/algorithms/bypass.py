"""The policy loss of verl's bypass mode with rollout correction (``compute_policy_loss_bypass_mode``
at verl 1dda039): the old policy is the rollout engine's (``algorithm.rollout_bypass``), and the
importance weights pi_theta / pi_rollout and the rejections are computed in each micro-batch against
the policy being trained (its log-probs of this very forward pass, detached).

- ``ppo_clip`` (``algorithm.rollout_bypass_loss``): ``actor.policy_loss`` on the ratio
  pi_theta / pi_rollout, which already carries the correction; the weights are only logged (applying
  them too would count the mismatch twice); the rejected tokens leave the loss.
- ``reinforce``: -w * A * log pi_theta, with w the truncated weights (``algorithm.rollout_is``; else
  1), detached, over the tokens not rejected: the policy gradient with explicit importance weights.

``rollout_is_batch_normalize`` divides by the weights' mean over the micro-batch on this rank (verl
averages over the micro-batch of every rank).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import Tensor

from rlcore.algorithms.aggregation import agg_loss
from rlcore.algorithms.masked import as_mask, masked_mean
from rlcore.algorithms.policy_losses import PolicyLossOutput
from rlcore.algorithms.rollout_correction import correct


@attrs.frozen
class BypassCorrection:
    """A policy loss (the calling shape of ``rlcore.algorithms.policy_losses``) whose
    ``old_log_prob`` is the rollout engine's."""

    policy_loss: Any  # the registered loss of actor.policy_loss, for ppo_clip
    algorithm: Any  # the job's AlgorithmConfig: rollout_bypass_loss and the rollout_is_* / rollout_rs_* settings

    def __call__(self, old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None
                 ) -> PolicyLossOutput:
        rollout_log_prob = old_log_prob
        metrics: dict[str, Tensor | float] = {}
        weights, mask = None, response_mask
        if self.algorithm.rollout_is_threshold is not None:
            with torch.no_grad():
                correction = correct(log_prob.detach(), rollout_log_prob, response_mask, self.algorithm)
            metrics = correction.metrics
            mask = correction.response_mask
            weights = correction.weights if self.algorithm.rollout_is else None
        if self.algorithm.rollout_bypass_loss == "reinforce":
            output = reinforce(rollout_log_prob, log_prob, advantages, mask, config, weights=weights,
                               norm_length=norm_length)
        else:
            output = self.policy_loss(old_log_prob, log_prob, advantages, mask, config, norm_length=norm_length)
        return PolicyLossOutput(output.loss, output.metrics | metrics)


def reinforce(rollout_log_prob, log_prob, advantages, response_mask, config, *, weights=None, norm_length=None
              ) -> PolicyLossOutput:
    """-w * A * log pi_theta per token (w = 1 without weights), aggregated with ``loss_agg_mode``;
    ``ppo_kl`` is the mean of log pi_rollout - log pi_theta."""
    mask = as_mask(response_mask)
    per_token = -advantages.float() * log_prob.float()
    if weights is not None:
        per_token = per_token * weights.detach().float()
    loss = agg_loss(per_token, mask, config.loss_agg_mode, norm_length=norm_length)
    ppo_kl = masked_mean(rollout_log_prob.float() - log_prob.detach().float(), mask)
    return PolicyLossOutput(loss, {"pg_loss": loss.detach(), "pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0,
                                   "ppo_kl": ppo_kl.detach()})


def bypass_policy_loss(algorithm, policy_loss):
    """The loss the actor trains with: ``BypassCorrection`` around ``policy_loss`` in bypass mode
    with a correction or the REINFORCE loss, else ``policy_loss`` itself."""
    if algorithm.rollout_bypass and (algorithm.rollout_is_threshold is not None
                                     or algorithm.rollout_bypass_loss == "reinforce"):
        return BypassCorrection(policy_loss, algorithm)
    return policy_loss
