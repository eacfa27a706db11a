"""Masked reductions over response tokens. Padding is selected away (``where``), never multiplied by
zero, so whatever a padded position holds (even inf or NaN) cannot leak into a result."""

from __future__ import annotations

import torch
from torch import Tensor


def as_mask(mask: Tensor) -> Tensor:
    """A bool mask from a bool, int or float one."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    kept = torch.where(as_mask(mask), values.float(), 0.0)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over masked-in entries; 0 where there are none (an empty batch is not an error)."""
    count = as_mask(mask).float()
    count = count.sum() if dim is None else count.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1.0)


def masked_max(values: Tensor, mask: Tensor) -> Tensor:
    """The largest masked-in entry; 0 where there are none. Selected with ``where``, not indexed, so the
    host never waits for the device to learn how many there are."""
    mask = as_mask(mask)
    largest = torch.where(mask, values.float(), -torch.inf).max()
    return torch.where(mask.any(), largest, 0.0)


def masked_min(values: Tensor, mask: Tensor) -> Tensor:
    """The smallest masked-in entry; 0 where there are none (as ``masked_max``)."""
    return -masked_max(-values.float(), mask)


def masked_std(values: Tensor, mask: Tensor) -> Tensor:
    """The unbiased standard deviation over masked-in entries; 0 for fewer than two."""
    return masked_var(values, mask).sqrt()


def masked_var(values: Tensor, mask: Tensor) -> Tensor:
    """Unbiased variance over masked-in entries (as verl); 0 for fewer than two entries."""
    count = as_mask(mask).float().sum()
    centered = values.float() - masked_mean(values, mask)
    return masked_sum(centered.square(), mask) / (count - 1.0).clamp(min=1.0)


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(values - mean) / std over masked-in entries; padded positions come out 0."""
    whitened = (values.float() - masked_mean(values, mask)) * torch.rsqrt(masked_var(values, mask) + eps)
    return torch.where(as_mask(mask), whitened, 0.0)
