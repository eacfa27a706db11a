"""The critic's clipped value loss and the explained-variance metric."""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from rlcore.algorithms.aggregation import agg_loss
from rlcore.algorithms.masked import as_mask, masked_mean


@attrs.frozen
class ValueLossOutput:
    loss: Tensor  # scalar, differentiable in vpreds
    metrics: dict[str, Tensor]  # vf_loss, vf_clipfrac, vpred_mean: 0-d, read once a step (read_metrics)


def value_loss(vpreds: Tensor, returns: Tensor, values: Tensor, response_mask: Tensor, cliprange_value: float,
               loss_agg_mode: str = "token-mean", *, norm_length: int | None = None) -> ValueLossOutput:
    """0.5 * max((v - R)^2, (clip(v, v_old +- cliprange_value) - R)^2), aggregated (as verl).

    ``vpreds`` are the critic's new predictions, ``values`` the ones the advantages were computed
    with, ``returns`` the targets; all (B, T).
    """
    mask = as_mask(response_mask)
    vpreds, returns, values = vpreds.float(), returns.float(), values.float()
    vclipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped = (vpreds - returns).square()
    clipped = (vclipped - returns).square()
    loss = 0.5 * agg_loss(torch.maximum(unclipped, clipped), mask, loss_agg_mode, norm_length=norm_length)
    metrics = {
        "vf_loss": loss.detach(),
        "vf_clipfrac": masked_mean((clipped > unclipped).float(), mask),
        "vpred_mean": masked_mean(vpreds.detach(), mask),
    }
    return ValueLossOutput(loss, metrics)


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, response_mask: Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over response tokens (verl's critic/vf_explained_var).

    1 is a perfect critic, 0 no better than a constant; the 1e-5 keeps constant returns finite.
    """
    mask = as_mask(response_mask)
    returns, values = returns.float()[mask], values.float()[mask]
    if returns.numel() < 2:  # no spread to explain (and torch's unbiased var would be NaN)
        return 1.0
    return float(1.0 - (returns - values).var() / (returns.var() + 1e-5))
