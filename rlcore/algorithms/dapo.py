"""DAPO's two data-side pieces: dynamic-sampling group filter and overlong reward shaping.

DAPO: https://arxiv.org/abs/2503.14476. The trainer calls these; neither depends on the estimator.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlcore.algorithms.groups import group_all_equal, group_sum


def filter_groups(group_ids: Tensor, metric: Tensor) -> Tensor:
    """Which samples to keep (B,) bool: groups whose ``metric`` (B,) is not the same for every member.

    A group that is all right or all wrong has zero advantage under group baselines, so it only
    dilutes the batch (``algorithm.filter_groups``, metric e.g. ``acc`` or ``score``). A group of a
    single sample is kept, as verl does: it has no spread to measure.
    """
    alone = group_sum(torch.ones_like(metric, dtype=torch.float32), group_ids) <= 1
    return alone | ~group_all_equal(metric, group_ids)


def overlong_penalty(response_lengths: Tensor, max_response_length: int, buffer_len: int,
                     penalty_factor: float) -> Tensor:
    """Soft overlong punishment (``reward.overlong_buffer``), added to each sample's score (B,) fp32.

    0 up to ``max_response_length - buffer_len`` tokens, then falling linearly to ``-penalty_factor``
    at ``max_response_length``. A buffer of 0 tokens penalises nothing.
    """
    lengths = response_lengths.float()
    if buffer_len <= 0:
        return torch.zeros_like(lengths)
    excess = lengths - (max_response_length - buffer_len)
    return (-excess / buffer_len * penalty_factor).clamp(max=0.0)
