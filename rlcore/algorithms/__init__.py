"""RL algorithms as pure fp32 tensor functions, looked up by name through the plugin registries.

- advantage estimators (``algorithm.adv_estimator``): ``AdvantageEstimator.compute(AdvantageInputs,
  AlgorithmConfig) -> AdvantageOutputs``;
- policy losses (``actor.policy_loss``): ``loss(old_log_prob, log_prob, advantages, response_mask,
  ActorConfig) -> PolicyLossOutput``;
- KL estimators (``actor.kl_loss_type``, ``algorithm.kl_penalty``): ``kl(log_prob, ref_log_prob)``;
- plain functions the trainer calls: ``agg_loss``, ``kl_loss``, ``kl_controller``,
  ``apply_kl_penalty``, ``value_loss``, ``explained_variance``, ``entropy_from_logits``,
  ``filter_groups``, ``overlong_penalty``.
"""

from rlcore.algorithms.advantages import AdvantageEstimator, AdvantageInputs, AdvantageOutputs
from rlcore.algorithms.aggregation import LOSS_AGG_MODES, agg_loss
from rlcore.algorithms.dapo import filter_groups, overlong_penalty
from rlcore.algorithms.entropy import entropy_from_logits
from rlcore.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_controller,
    kl_loss,
    straight_through,
)
from rlcore.algorithms.masked import masked_mean, masked_whiten
from rlcore.algorithms.policy_losses import PolicyLoss, PolicyLossOutput, clip_range
from rlcore.algorithms.value import ValueLossOutput, explained_variance, value_loss

__all__ = [
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "AdvantageInputs",
    "AdvantageOutputs",
    "FixedKLController",
    "PolicyLoss",
    "PolicyLossOutput",
    "ValueLossOutput",
    "agg_loss",
    "apply_kl_penalty",
    "clip_range",
    "entropy_from_logits",
    "explained_variance",
    "filter_groups",
    "kl_controller",
    "kl_loss",
    "masked_mean",
    "masked_whiten",
    "overlong_penalty",
    "straight_through",
    "value_loss",
]
