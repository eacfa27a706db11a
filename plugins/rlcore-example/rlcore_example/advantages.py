"""An advantage estimator from outside the core: score minus the median score of its group.

The median is a baseline that one outlier reward (a reward-model glitch, a lucky parse) cannot
drag, unlike GRPO's mean. It is registered as ``example/median_baseline`` and used by name:
``algorithm.adv_estimator = "example/median_baseline"``.
"""

import torch

from rlcore.api import AdvantageEstimator, AdvantageInputs, AdvantageOutputs


@torch.no_grad()
def compute_median_baseline(batch: AdvantageInputs, config) -> AdvantageOutputs:
    mask = batch.response_mask != 0  # (B, T)
    scores = torch.where(mask, batch.token_level_rewards.float(), 0.0).sum(-1)  # (B,)
    advantage = torch.zeros_like(scores)
    for group in torch.unique(batch.group_ids):
        members = batch.group_ids == group
        values = scores[members].sort().values
        middle = values.numel() // 2
        # the true median: the mean of the two middle values when the group is even-sized
        median = values[middle] if values.numel() % 2 else (values[middle - 1] + values[middle]) / 2
        advantage[members] = scores[members] - median
    advantages = torch.where(mask, advantage.unsqueeze(-1), 0.0)  # (B, T)
    return AdvantageOutputs(advantages, advantages)


MEDIAN_BASELINE = AdvantageEstimator(
    compute_median_baseline,
    needs_groups=True,
    doc="score minus the median score of its group",
)
