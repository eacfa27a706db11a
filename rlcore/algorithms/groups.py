"""Per-group statistics for samples of the same prompt, broadcast back to each sample (vectorised)."""

from __future__ import annotations

import attrs
import torch
from torch import Tensor


def _dense(group_ids: Tensor) -> tuple[Tensor, int]:
    """Group ids renumbered 0..G-1 (B,), and G."""
    unique, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, unique.numel()


def group_sum(values: Tensor, group_ids: Tensor) -> Tensor:
    """Each sample's group total of ``values`` (B,) or (B, T): per position with a second dim."""
    inverse, num_groups = _dense(group_ids)
    totals = torch.zeros((num_groups, *values.shape[1:]), dtype=values.dtype, device=values.device)
    return totals.index_add_(0, inverse, values)[inverse]


@attrs.frozen
class GroupStats:
    """Statistics of each sample's group over its members that count, broadcast to (B,)."""

    count: Tensor  # (B,) members that count
    mean: Tensor  # (B,)
    std: Tensor  # (B,) unbiased, as torch.std; 0 for a group of one


def group_stats(values: Tensor, group_ids: Tensor, counts: Tensor) -> GroupStats:
    """Mean and std of ``values`` (B,) within groups, over samples where ``counts`` (B,) bool is true."""
    weight = counts.float()
    values = torch.where(counts, values.float(), 0.0)
    count = group_sum(weight, group_ids)
    mean = group_sum(values, group_ids) / count.clamp(min=1.0)
    squares = torch.where(counts, (values - mean).square(), 0.0)
    std = (group_sum(squares, group_ids) / (count - 1.0).clamp(min=1.0)).sqrt()
    return GroupStats(count, mean, std)


def group_all_equal(values: Tensor, group_ids: Tensor) -> Tensor:
    """(B,) bool: every member of the sample's group has the same value (exact, no float mean)."""
    inverse, num_groups = _dense(group_ids)
    values = values.float()
    high = torch.full((num_groups,), -torch.inf, device=values.device).scatter_reduce(
        0, inverse, values, reduce="amax")
    low = torch.full((num_groups,), torch.inf, device=values.device).scatter_reduce(
        0, inverse, values, reduce="amin")
    return (high == low)[inverse]


def group_ids_of(uids: list[str]) -> Tensor:
    """(B,) int64: the same id for the samples of one prompt (its ``uid``), numbered in order."""
    index: dict[str, int] = {}
    return torch.tensor([index.setdefault(u, len(index)) for u in uids], dtype=torch.long)
