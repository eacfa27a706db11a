"""Rollout importance sampling: correcting for the engine that sampled not being the policy that
trains (an inference engine in bf16 against a trainer in fp32, a stale engine), as verl's
``algorithm.rollout_is_*``.

The weight of a token is pi_train / pi_rollout = exp(old_log_probs - rollout_log_probs), at the
``level`` asked for: per token, per sequence (the product of its tokens' ratios) or the geometric
mean over the sequence. ``truncate`` caps the weights at the upper threshold (truncated importance
sampling, TIS); ``mask`` keeps the true ratios and drops the tokens (or sequences) outside
[lower, upper] from the response mask. A veto drops every sequence holding a token whose ratio is
below ``veto``. Padding gets weight 0.

Reference: Liu, Li et al., "When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch" (2025); Yao et al., "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training" (2025).
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from rlcore.algorithms.masked import as_mask, masked_mean

LOG_RATIO_BOUND = 20.0  # exp(20) ~ 5e8: ratios beyond are numerical accidents, not information


@attrs.frozen
class RolloutCorrection:
    weights: Tensor  # (B, T) fp32, 0 on padding
    response_mask: Tensor  # (B, T), with mask-mode and veto rejections removed
    metrics: dict[str, float]


def rollout_importance_weights(old_log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor, *,
                               upper: float, lower: float | None = None, level: str = "token",
                               mode: str = "truncate", veto: float | None = None) -> RolloutCorrection:
    """Weights, the response mask after rejection, and ``mismatch/`` metrics; all inputs (B, T)."""
    mask = as_mask(response_mask)
    lower = 1.0 / upper if lower is None else lower
    log_ratio = torch.where(mask, old_log_probs.float() - rollout_log_probs.float(), 0.0)  # (B, T)
    log_weight = _at_level(log_ratio, mask, level).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_weight.exp()
    kept = mask.clone()
    if mode == "mask":
        kept &= (ratio >= lower) & (ratio <= upper)
    elif mode != "truncate":
        raise ValueError(f"rollout_is_mode must be 'truncate' or 'mask', got {mode!r}")
    vetoed = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    if veto is not None:
        vetoed = ((log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp() < veto) & mask).any(dim=1)
        kept &= ~vetoed[:, None]
    weights = (ratio.clamp(max=upper) if mode == "truncate" else ratio) * mask
    metrics = _metrics(ratio, log_ratio, old_log_probs, rollout_log_probs, mask, kept, vetoed, upper, lower)
    return RolloutCorrection(weights=weights, response_mask=kept.to(response_mask.dtype), metrics=metrics)


def _at_level(log_ratio: Tensor, mask: Tensor, level: str) -> Tensor:
    if level == "token":
        return log_ratio
    per_sequence = log_ratio.sum(dim=1, keepdim=True)  # (B, 1): log of the product of the ratios
    if level == "geometric":
        per_sequence = per_sequence / mask.sum(dim=1, keepdim=True).clamp(min=1)
    elif level != "sequence":
        raise ValueError(f"rollout_is_level must be 'token', 'sequence' or 'geometric', got {level!r}")
    return per_sequence.expand_as(log_ratio)


def _metrics(ratio: Tensor, log_ratio: Tensor, old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor,
             kept: Tensor, vetoed: Tensor, upper: float, lower: float) -> dict[str, float]:
    valid = ratio[mask]
    if valid.numel() == 0:
        return {}
    normalized = valid / valid.mean()
    token_ratio = log_ratio.exp()
    return {
        "mismatch/rollout_is_mean": float(valid.mean()),
        "mismatch/rollout_is_std": float(valid.std()) if valid.numel() > 1 else 0.0,
        "mismatch/rollout_is_min": float(valid.min()),
        "mismatch/rollout_is_max": float(valid.max()),
        "mismatch/rollout_is_eff_sample_size": float(1.0 / (normalized**2).mean()),
        "mismatch/rollout_is_ratio_fraction_high": float((valid > upper).float().mean()),
        "mismatch/rollout_is_ratio_fraction_low": float((valid < lower).float().mean()),
        "mismatch/rollout_is_masked_fraction": float(1.0 - kept[mask].float().mean()),
        "mismatch/rollout_is_veto_fraction": float(vetoed.float().mean()),
        # KL(pi_rollout || pi_train) from the rollout's samples: direct and k3 estimators
        "mismatch/mismatch_kl": float(masked_mean(-log_ratio, mask)),
        "mismatch/mismatch_k3_kl": float(masked_mean(token_ratio - log_ratio - 1.0, mask)),
        "mismatch/mismatch_training_ppl": float(masked_mean(-old_log_probs.float(), mask).exp()),
        "mismatch/mismatch_rollout_ppl": float(masked_mean(-rollout_log_probs.float(), mask).exp()),
        "mismatch/mismatch_token_prob_abs_diff": float(masked_mean(
            (old_log_probs.float().exp() - rollout_log_probs.float().exp()).abs(), mask)),
    }
