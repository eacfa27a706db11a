"""Divergence-based rejection of off-policy samples, as verl's ``rollout_correction.rollout_rs``
(``rollout_corr_helper.compute_rollout_rejection_mask`` at verl 1dda039): tokens, or whole
sequences, whose divergence between the policy that trains and the one that sampled lies out of
bounds leave the loss.

With r = pi_train / pi_rollout per token and log r clamped to +-20, the per-token divergences are
k1 = -log r, k2 = (log r)^2 / 2 and k3 = r - 1 - log r. A criterion is a divergence at a level:
``token_k*`` per token, ``seq_sum_k*`` / ``seq_mean_k*`` the sum / mean over the sequence's tokens,
``seq_max_k2`` / ``seq_max_k3`` the largest over its tokens. A k1 criterion keeps
log(lower) <= k1 <= log(upper), so the bounds are on pi_rollout / pi_train (one number: the upper
bound, the lower its inverse); k2 and k3 keep the divergence <= the bound. A token is kept only if
every criterion keeps it (a sequence criterion keeps or drops all its tokens).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import torch
from torch import Tensor

from rlcore.algorithms.masked import as_mask, masked_mean

LOG_RATIO_BOUND = 20.0
LEVELS = ("token", "seq_sum", "seq_mean", "seq_max")
CRITERIA = tuple(f"{level}_k{k}" for level in LEVELS for k in (1, 2, 3) if (level, k) != ("seq_max", 1))


@attrs.frozen
class Criterion:
    name: str  # one of CRITERIA
    upper: float
    lower: float | None = None  # k1 only: the lower bound of pi_rollout / pi_train


def parse_criteria(given: Mapping[str, Any], where: str) -> tuple[Criterion, ...]:
    """Criteria from {name: bound}: a k1 bound is a number (upper) or [lower, upper], a k2 or k3
    bound a number. Raises ValueError naming ``where`` (the setting) and the criterion."""
    criteria = []
    for name, bound in given.items():
        if name not in CRITERIA:
            raise ValueError(f"{where}: unknown criterion {name!r}; known: {', '.join(CRITERIA)}")
        numbers = list(bound) if isinstance(bound, (list, tuple)) else [bound]
        if not all(isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0 for n in numbers) or not (
                len(numbers) == 1 or (len(numbers) == 2 and name.endswith("k1"))):
            shape = "a positive number (the upper bound) or [lower, upper]" if name.endswith("k1") else \
                "a positive number (the upper bound of the divergence)"
            raise ValueError(f"{where}.{name}: expected {shape}, got {bound!r}")
        if name.endswith("k1"):
            lower, upper = (1.0 / numbers[0], numbers[0]) if len(numbers) == 1 else numbers
            if lower > upper:
                raise ValueError(f"{where}.{name}: the lower bound {lower} is above the upper bound {upper}")
            criteria.append(Criterion(name, float(upper), float(lower)))
        else:
            criteria.append(Criterion(name, float(numbers[0])))
    return tuple(criteria)


def rejection_mask(log_ratio: Tensor, response_mask: Tensor, criteria: tuple[Criterion, ...]
                   ) -> tuple[Tensor, dict[str, float]]:
    """(kept (B, T) bool, metrics): ``log_ratio`` = log(pi_train / pi_rollout) per token (B, T).
    Metrics (without the ``rollout_corr/`` prefix), verl's names: per criterion its statistic's mean,
    max and min and the fractions of tokens and sequences it drops; then the fractions all drop."""
    mask = as_mask(response_mask)
    safe = torch.where(mask, log_ratio.float(), 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    divergences = {"k1": -safe, "k2": 0.5 * safe.square(), "k3": safe.exp() - 1.0 - safe}  # each (B, T)
    rows = mask.any(dim=1)
    kept = mask.clone()
    metrics: dict[str, float] = {}
    for criterion in criteria:
        level, k = criterion.name.rsplit("_", 1)
        statistic = _at_level(divergences[k], mask, level)  # (B, T), a sequence's value on each of its tokens
        if k == "k1":
            keep = (statistic >= math.log(criterion.lower)) & (statistic <= math.log(criterion.upper))
        else:
            keep = statistic <= criterion.upper
        kept &= keep
        prefix = f"rollout_rs_{criterion.name}"
        metrics |= {f"{prefix}_mean": float(masked_mean(statistic, mask)),
                    f"{prefix}_max": float(statistic[mask].max()) if mask.any() else 0.0,
                    f"{prefix}_min": float(statistic[mask].min()) if mask.any() else 0.0,
                    f"{prefix}_masked_fraction": float(masked_mean((~keep).float(), mask)),
                    f"{prefix}_seq_masked_fraction": _dropped_rows(mask & ~keep, rows)}
    metrics["rollout_rs_masked_fraction"] = float(masked_mean((~kept).float(), mask))
    metrics["rollout_rs_seq_masked_fraction"] = _dropped_rows(mask & ~kept, rows)
    return kept, metrics


def _at_level(per_token: Tensor, mask: Tensor, level: str) -> Tensor:
    if level == "token":
        return per_token
    if level == "seq_max":
        per_sequence = torch.where(mask, per_token, -torch.inf).amax(dim=1)
        per_sequence = torch.where(mask.any(dim=1), per_sequence, 0.0)
    else:
        per_sequence = torch.where(mask, per_token, 0.0).sum(dim=1)
        if level == "seq_mean":
            per_sequence = per_sequence / mask.sum(dim=1).clamp(min=1)
    return per_sequence[:, None].expand_as(per_token)


def _dropped_rows(dropped: Tensor, rows: Tensor) -> float:
    """The fraction of sequences (with response tokens) that lost a token."""
    return float(dropped.any(dim=1)[rows].float().mean()) if rows.any() else 0.0
