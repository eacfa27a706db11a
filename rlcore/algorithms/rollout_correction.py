"""Rollout importance sampling: correcting for the engine that sampled not being the policy that
trains (an inference engine in bf16 against a trainer in fp32, a stale engine), as verl's
``algorithm.rollout_is_*``.

The weight of a token is pi_train / pi_rollout = exp(old_log_probs - rollout_log_probs), at the
``level`` asked for: per token, per sequence (the product of its tokens' ratios) or the geometric
mean over the sequence. ``truncate`` caps the weights at the upper threshold (truncated importance
sampling, TIS); ``mask`` keeps the true ratios and drops the tokens (or sequences) outside
[lower, upper] from the response mask. A veto drops every sequence holding a token whose ratio is
below ``veto``. Padding gets weight 0. ``batch_normalize`` divides the weights by their mean over the
batch (over tokens at token level, over sequences otherwise), after truncation, so they average 1.

Reference: Liu, Li et al., "When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch" (2025); Yao et al., "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training" (2025).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import Tensor

from rlcore.algorithms.masked import as_mask, masked_max, masked_mean, masked_min, masked_std
from rlcore.algorithms.rejection import Criterion, parse_criteria, rejection_mask
from rlcore.batch import Batch
from rlcore.errors import RlcoreError

LOG_RATIO_BOUND = 20.0  # exp(20) ~ 5e8: ratios beyond are numerical accidents, not information


@attrs.frozen
class RolloutCorrection:
    weights: Tensor  # (B, T) fp32, 0 on padding
    response_mask: Tensor  # (B, T), with mask-mode and veto rejections removed
    metrics: dict[str, Tensor | float]  # 0-d tensors on the inputs' device (``rlcore.metrics.read_metrics``)


def rollout_importance_weights(old_log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor, *,
                               upper: float, lower: float | None = None, level: str = "token",
                               mode: str = "truncate", veto: float | None = None,
                               batch_normalize: bool = False, reject: tuple[str, float, float] | None = None,
                               criteria: tuple[Criterion, ...] = ()) -> RolloutCorrection:
    """Weights, the response mask after rejection, and ``rollout_corr/`` metrics; all inputs (B, T).
    ``reject`` = (level, lower, upper): also drop the tokens whose ratio at that level (which may
    differ from the weights') lies outside [lower, upper]; ``criteria``: also drop those verl's
    divergence criteria reject (``rlcore.algorithms.rejection``)."""
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
    if reject is not None:
        reject_level, reject_lower, reject_upper = reject
        reject_ratio = _at_level(log_ratio, mask, reject_level).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
        kept &= (reject_ratio >= reject_lower) & (reject_ratio <= reject_upper)
    rejection_metrics = {}
    if criteria:
        criteria_kept, rejection_metrics = rejection_mask(log_ratio, mask, criteria)
        kept &= criteria_kept
    vetoed = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    if veto is not None:
        vetoed = ((log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp() < veto) & mask).any(dim=1)
        kept &= ~vetoed[:, None]
    weights = (ratio.clamp(max=upper) if mode == "truncate" else ratio) * mask
    metrics: dict[str, Tensor | float] = {}
    if batch_normalize:
        factor = _batch_mean(weights, mask, level)
        factor = torch.where(factor > 1e-8, factor, 1.0)  # weights of ~0 everywhere stay as they are
        weights = weights / factor
        metrics["rollout_corr/rollout_is_batch_norm_factor"] = factor
    metrics |= _metrics(ratio, old_log_probs, rollout_log_probs, mask, kept, vetoed, weights, upper, lower)
    metrics |= {f"rollout_corr/{k}": v for k, v in rejection_metrics.items()}
    return RolloutCorrection(weights=weights, response_mask=kept.to(response_mask.dtype), metrics=metrics)


def _batch_mean(weights: Tensor, mask: Tensor, level: str) -> Tensor:
    """The weights' mean over the batch: over its tokens at token level, else over its sequences
    (each sequence's tokens share one weight)."""
    if level == "token":
        return masked_mean(weights, mask)
    return masked_mean(_per_row_mean(weights, mask), mask.any(dim=1))


def _at_level(log_ratio: Tensor, mask: Tensor, level: str) -> Tensor:
    if level == "token":
        return log_ratio
    per_sequence = log_ratio.sum(dim=1, keepdim=True)  # (B, 1): log of the product of the ratios
    if level == "geometric":
        per_sequence = per_sequence / mask.sum(dim=1, keepdim=True).clamp(min=1)
    elif level != "sequence":
        raise ValueError(f"rollout_is_level must be 'token', 'sequence' or 'geometric', got {level!r}")
    return per_sequence.expand_as(log_ratio)


def _metrics(ratio: Tensor, old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor,
             kept: Tensor, vetoed: Tensor, weights: Tensor, upper: float, lower: float) -> dict[str, Tensor]:
    """verl's ``rollout_corr/`` metrics (``rollout_corr_helper`` at verl 1dda039): statistics of the
    weights applied (mean, max, min; std and effective sample size of the weights clamped to
    [0, upper]), the fractions of raw ratios outside the bounds, per-sequence means, the
    rejections, and the off-policy gap (KL, perplexities, chi-squared). Each is a 0-d tensor on the
    inputs' device, computed without the host waiting for it (every selection a ``where``, never an index:
    the update weighs each micro-batch with these and reads them once, at the step's end); 0 where the
    batch has no response token."""
    rows = mask.any(dim=1)  # sequences with at least one response token
    applied = weights.float()
    clamped = applied.clamp(min=0.0, max=upper)
    clamped_mean = masked_mean(clamped, mask)
    normalized = clamped / (clamped_mean + 1e-8)
    tokens = mask.sum()
    seq_weights = _per_row_mean(applied, mask)  # (B,): read at ``rows``
    seq_raw = _per_row_mean(ratio, mask)
    metrics = {
        "rollout_is_mean": masked_mean(applied, mask),
        "rollout_is_max": masked_max(applied, mask),
        "rollout_is_min": masked_min(applied, mask),
        "rollout_is_std": torch.where(tokens > 1, (masked_mean(clamped.square(), mask) - clamped_mean.square())
                                      .clamp(min=0).sqrt(), 0.0),
        "rollout_is_eff_sample_size": torch.where(tokens > 0, 1.0 / masked_mean(normalized.square(), mask), 0.0),
        "rollout_is_ratio_fraction_high": masked_mean((ratio > upper).float(), mask),
        "rollout_is_ratio_fraction_low": masked_mean((ratio < lower).float(), mask),
        "rollout_is_seq_mean": masked_mean(seq_weights, rows),
        "rollout_is_seq_std": masked_std(seq_weights, rows),
        "rollout_is_seq_max": masked_max(seq_weights, rows),
        "rollout_is_seq_min": masked_min(seq_weights, rows),
        "rollout_is_seq_max_deviation": masked_max((seq_weights - 1.0).abs(), rows),
        "rollout_is_seq_fraction_high": masked_mean((seq_raw > upper).float(), rows),
        "rollout_is_seq_fraction_low": masked_mean((seq_raw < lower).float(), rows),
        # rejections: mask mode and the veto (rlcore's own, under verl's rejection-sampling names)
        "rollout_rs_masked_fraction": masked_mean((~kept).float(), mask),
        "rollout_rs_seq_masked_fraction": masked_mean((mask & ~kept).any(dim=1).float(), rows),
        "rollout_is_veto_fraction": vetoed.float().mean(),
    }
    return {f"rollout_corr/{k}": v for k, v in (metrics | off_policy_metrics(old_log_probs, rollout_log_probs, mask,
                                                                              rows)).items()}


def off_policy_metrics(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, rows: Tensor
                       ) -> dict[str, Tensor]:
    """The gap between the policy that sampled and the one that trains, on the rollout's samples:
    KL(pi_rollout || pi_train) direct and k3, the mean absolute log-prob gap per token, per-sequence perplexities and their log difference,
    chi-squared of the token and sequence ratios (verl's ``compute_offpolicy_metrics``); the sequence statistics
    over ``rows`` (B,), the sequences with a response token. 0-d tensors, as ``_metrics``."""
    old, rollout = old_log_probs.float(), rollout_log_probs.float()
    log_ratio = torch.where(mask, old - rollout, 0.0)
    train_seq = _per_row_mean(old, mask)  # (B,) mean log-prob of each sequence: read at ``rows``
    rollout_seq = _per_row_mean(rollout, mask)
    log_ppl_diff = rollout_seq - train_seq
    safe = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    seq_log_ratio = safe.sum(dim=1).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return {
        "training_ppl": masked_mean(torch.exp(-train_seq), rows),
        "training_log_ppl": masked_mean(-train_seq, rows),
        "kl": masked_mean(-log_ratio, mask),
        "k3_kl": masked_mean(log_ratio.exp() - log_ratio - 1.0, mask),
        # rlcore's own: the mean absolute gap of the two log-probs per token (the engine's numerics against the
        # trainer's; verl logs the gap of the probabilities, training/rollout_probs_diff_mean)
        "log_prob_abs_diff": masked_mean(log_ratio.abs(), mask),
        "rollout_ppl": masked_mean(torch.exp(-rollout_seq), rows),
        "rollout_log_ppl": masked_mean(-rollout_seq, rows),
        "log_ppl_diff": masked_mean(log_ppl_diff, rows),
        "log_ppl_abs_diff": masked_mean(log_ppl_diff.abs(), rows),
        "log_ppl_diff_max": masked_max(log_ppl_diff, rows),
        "log_ppl_diff_min": masked_min(log_ppl_diff, rows),
        "ppl_ratio": masked_mean(log_ppl_diff.exp(), rows),
        "chi2_token": torch.where(mask.any(), masked_mean(safe.exp().square(), mask) - 1.0, 0.0),
        "chi2_seq": torch.where(rows.any(), masked_mean(torch.exp(2.0 * seq_log_ratio), rows) - 1.0, 0.0),
    }


def _per_row_mean(values: Tensor, mask: Tensor) -> Tensor:
    """(B,) the mean of each row's masked values (0 for a row without any)."""
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def correct_batch(batch: Batch, algorithm, missing_log_probs: str, *, in_update: bool = False
                  ) -> tuple[Batch, dict[str, Tensor | float]]:
    """(batch, ``rollout_corr/`` metrics) for ``algorithm.rollout_is_*``: the metrics compare the
    engine's and the actor's log-probs; with ``rollout_is`` the batch gains the weights, and with
    ``rollout_is`` or ``rollout_rs_criteria`` the rejections, that the actor's update applies.
    ``missing_log_probs`` says why a batch may lack the engine's log-probs, for the error. In bypass
    mode the correction is the actor's, per micro-batch (``BypassCorrection``): nothing here; likewise
    ``in_update``, where the update's own forward pass gives the old log-probs (``weigh_micro_batch``)."""
    if algorithm.rollout_is_threshold is None or algorithm.rollout_bypass:
        return batch, {}
    if "rollout_log_probs" not in batch:
        raise RlcoreError(f"algorithm.rollout_is_threshold needs the log-probs of the sampled tokens: "
                          f"{missing_log_probs}")
    if in_update:
        return batch, {}
    correction = correct(batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], algorithm)
    applied = {"rollout_is_weights": correction.weights} if algorithm.rollout_is else {}
    if algorithm.rollout_is or algorithm.rollout_rs_criteria:
        applied["rollout_is_response_mask"] = correction.response_mask
    return batch.update(Batch(applied)), correction.metrics


def needs_whole_batch(algorithm) -> str | None:
    """Why the correction of ``algorithm`` needs the whole batch's old log-probs before the update, or None
    where each micro-batch can be weighed alone with the same result: truncated weights per token or
    per sequence, nothing rejected (a rejection changes the tokens a loss averages over, which the
    update counts over the whole mini-batch) and no normalisation over the batch."""
    for key, on in (("algorithm.rollout_is_mode = 'mask' rejects tokens", algorithm.rollout_is_mode == "mask"),
                    ("algorithm.rollout_is_veto_threshold rejects sequences", algorithm.rollout_is_veto_threshold
                     is not None),
                    ("algorithm.rollout_rs_level rejects tokens", algorithm.rollout_rs_level is not None),
                    ("algorithm.rollout_rs_criteria rejects tokens", bool(algorithm.rollout_rs_criteria)),
                    ("algorithm.rollout_is_batch_normalize averages the weights over the batch",
                     algorithm.rollout_is_batch_normalize)):
        if on:
            return key
    return None


def weigh_micro_batch(train_log_prob: Tensor, rollout_log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
                      algorithm) -> tuple[Tensor, dict[str, Tensor | float]]:
    """``correct_batch`` and ``actor_update_batch`` for one micro-batch of an on-policy update, whose own
    forward pass gives the old log-probs (``train_log_prob``, detached here): the advantages weighted by
    the truncated pi_train / pi_rollout (with ``rollout_is``), and the ``rollout_corr/`` metrics of the
    micro-batch. Only where ``needs_whole_batch`` finds nothing that needs the whole batch."""
    with torch.no_grad():
        correction = correct(train_log_prob.detach(), rollout_log_prob, response_mask, algorithm)
    return (advantages * correction.weights if algorithm.rollout_is else advantages), correction.metrics


def correct(train_log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor, algorithm
            ) -> RolloutCorrection:
    """``rollout_importance_weights`` with the settings of ``algorithm`` (an ``AlgorithmConfig``)."""
    return rollout_importance_weights(
        train_log_probs, rollout_log_probs, response_mask,
        upper=algorithm.rollout_is_threshold, lower=algorithm.rollout_is_threshold_lower,
        level=algorithm.rollout_is_level, mode=algorithm.rollout_is_mode, veto=algorithm.rollout_is_veto_threshold,
        batch_normalize=algorithm.rollout_is_batch_normalize, reject=_rejection(algorithm),
        criteria=parse_criteria(algorithm.rollout_rs_criteria or {}, "algorithm.rollout_rs_criteria"))


def rollout_as_old_policy(batch: Batch, algorithm) -> Batch:
    """With ``algorithm.rollout_bypass``, the batch's old log-probs are the rollout engine's (verl's
    bypass mode: two policies, pi_rollout and pi_theta); else the batch as it is."""
    if not algorithm.rollout_bypass:
        return batch
    if "rollout_log_probs" not in batch:
        raise RlcoreError("algorithm.rollout_bypass takes the rollout engine's log-probs as the old policy's, but the "
                          "batch has none (rollout_log_probs): set rollout.calculate_log_probs = true")
    return batch.update(Batch({"old_log_probs": batch["rollout_log_probs"].float()}))


def _rejection(algorithm) -> tuple[str, float, float] | None:
    """(level, lower, upper) of ``algorithm.rollout_rs_level``, or None."""
    if algorithm.rollout_rs_level is None:
        return None
    upper = algorithm.rollout_rs_threshold
    if upper is None:
        raise RlcoreError("algorithm.rollout_rs_level needs algorithm.rollout_rs_threshold (the ratio's upper bound)")
    lower = algorithm.rollout_rs_threshold_lower if algorithm.rollout_rs_threshold_lower is not None else 1.0 / upper
    return algorithm.rollout_rs_level, lower, upper


def actor_update_batch(batch: Batch) -> Batch:
    """What the actor trains on: with rollout importance sampling, each token's advantage weighted
    by pi_train / pi_rollout (for every built-in policy loss the same as weighting its loss: the
    weight is positive and the losses are linear in the advantage, only clip_cov's and kl_cov's
    choice of tokens sees the weighted advantages) and the rejected tokens out of the mask (with
    ``rollout_rs_criteria`` alone, the rejections without weights)."""
    applied = {}
    if "rollout_is_weights" in batch:
        applied["advantages"] = batch["advantages"] * batch["rollout_is_weights"]
    if "rollout_is_response_mask" in batch:
        applied["response_mask"] = batch["rollout_is_response_mask"]
    return batch.update(Batch(applied)) if applied else batch


# --- the job's checks of these settings (registered by rlcore.algorithms.plugin) -------------------


def problems(job) -> list[str]:
    """Errors of the ``algorithm.rollout_is*``, ``rollout_rs*`` and ``rollout_bypass*`` settings, each
    naming its key."""
    config = job.config
    algorithm, errors = config.algorithm, []
    upper, lower = algorithm.rollout_is_threshold, algorithm.rollout_is_threshold_lower
    if upper is not None and not config.rollout.calculate_log_probs:
        errors.append("algorithm.rollout_is_threshold compares the engine's log-probs with the actor's: "
                      "rollout.calculate_log_probs must be true")
    if algorithm.rollout_bypass and not config.rollout.calculate_log_probs:
        errors.append("algorithm.rollout_bypass takes the engine's log-probs as the old policy's: "
                      "rollout.calculate_log_probs must be true")
    if algorithm.rollout_rs_criteria:
        try:
            parse_criteria(algorithm.rollout_rs_criteria, "algorithm.rollout_rs_criteria")
        except ValueError as exc:
            errors.append(str(exc))
        if upper is None:
            errors.append("algorithm.rollout_rs_criteria needs rollout correction on: set algorithm.rollout_is_threshold "
                          "(the weights' upper bound; with algorithm.rollout_is = false they are only logged)")
    if algorithm.rollout_rs_level is not None and algorithm.rollout_rs_threshold is None:
        errors.append("algorithm.rollout_rs_level rejects by the ratio's bounds: set algorithm.rollout_rs_threshold")
    if algorithm.rollout_rs_level is not None and upper is None:
        errors.append("algorithm.rollout_rs_level needs rollout importance sampling on: set "
                      "algorithm.rollout_is_threshold")
    if upper is not None and lower is not None and lower > upper:
        errors.append(f"algorithm.rollout_is_threshold_lower = {lower} is above algorithm.rollout_is_threshold = "
                      f"{upper}: the importance weights kept lie between them")
    return errors


def unused(job) -> list[str]:
    """Warnings for ``algorithm.rollout_is*`` settings given while rollout importance sampling is off,
    and ``algorithm.rollout_bypass_loss`` while bypass mode is off."""
    algorithm, warnings = job.config.algorithm, []
    if algorithm.rollout_is_threshold is None:
        for key in job.given("algorithm"):
            if key.startswith("algorithm.rollout_is") and key != "algorithm.rollout_is_threshold":
                warnings.append(f"{key} has no effect while algorithm.rollout_is_threshold is unset")
    if not algorithm.rollout_bypass:
        for key in job.given("algorithm.rollout_bypass_loss"):
            warnings.append(f"{key} has no effect while algorithm.rollout_bypass is false (the loss is actor.policy_loss)")
    return warnings


# --- verl's algorithm.rollout_correction.* ---------------------------------------------------------

VERL_PREFIX = "algorithm.rollout_correction."
VERL_HOW = "translated onto algorithm.rollout_is*, rollout_rs_criteria and rollout_bypass*"
VERL_IS_THRESHOLD = 2.0  # verl's default rollout_is_threshold


def _bounds(key: str, value: Any) -> tuple[float | None, float]:
    """verl's threshold: a number (the upper bound) or 'lower_upper'."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None, float(value)
    if isinstance(value, str) and value.count("_") == 1:
        try:
            lower, upper = (float(part) for part in value.split("_"))
            return lower, upper
        except ValueError:
            pass
    raise ValueError(f"{key}: expected a number (the upper bound) or 'lower_upper' such as '0.5_2.0', got {value!r}")


def from_verl(given: dict[str, Any]) -> dict[str, Any]:
    """verl's ``algorithm.rollout_correction.*`` values (by their last name) -> rlcore's
    ``algorithm.rollout_is*``, ``rollout_rs_criteria`` and ``rollout_bypass*`` settings. Raises
    ValueError naming the key for what rlcore cannot do.

    As verl: the weights at the ``rollout_is`` level truncated at the threshold (TIS), or with a
    'lower_upper' threshold kept only within the bounds (IcePop: rlcore's mask mode); ``rollout_rs``
    rejects by its divergence criteria, with or without weights; ``bypass_mode`` takes the engine's
    log-probs as the old policy's and corrects in each micro-batch with ``loss_type``."""
    p = VERL_PREFIX
    unknown = sorted(set(given) - {"rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                                   "rollout_rs_threshold", "bypass_mode", "loss_type"})
    if unknown:
        raise ValueError(f"{p}{unknown[0]}: unknown key; verl's are rollout_is, rollout_is_threshold, rollout_rs, "
                         "rollout_rs_threshold, rollout_is_batch_normalize, bypass_mode, loss_type")
    loss_type = given.get("loss_type", "ppo_clip")
    if loss_type not in ("ppo_clip", "reinforce"):
        raise ValueError(f"{p}loss_type: expected ppo_clip or reinforce, got {loss_type!r}")
    level, rejection = given.get("rollout_is"), given.get("rollout_rs")
    if level not in (None, "token", "sequence"):
        raise ValueError(f"{p}rollout_is: expected token, sequence or null, got {level!r}")
    ours: dict[str, Any] = {}
    if given.get("bypass_mode", False):
        ours["algorithm.rollout_bypass"] = True
    if "loss_type" in given:
        ours["algorithm.rollout_bypass_loss"] = loss_type
    if given.get("rollout_is_batch_normalize", False):
        ours["algorithm.rollout_is_batch_normalize"] = True
    threshold = given.get("rollout_is_threshold", VERL_IS_THRESHOLD)
    if threshold is None:
        level = None  # verl computes no weights without a threshold
    if threshold is not None or level is not None or rejection is not None:
        lower, upper = _bounds(p + "rollout_is_threshold", VERL_IS_THRESHOLD if threshold is None else threshold)
        ours["algorithm.rollout_is_threshold"] = upper
        if lower is not None:  # IcePop: weights outside [lower, upper] are dropped
            ours |= {"algorithm.rollout_is_threshold_lower": lower, "algorithm.rollout_is_mode": "mask"}
    ours["algorithm.rollout_is"] = level is not None
    if level is not None:
        ours["algorithm.rollout_is_level"] = level
        ours.setdefault("algorithm.rollout_is_mode", "truncate")
    if rejection is not None:
        ours["algorithm.rollout_rs_criteria"] = _rejection_criteria(rejection, given.get("rollout_rs_threshold"))
    return ours


def _rejection_criteria(rejection: Any, thresholds: Any) -> dict[str, Any]:
    """verl's ``rollout_rs`` ('token_k1,seq_max_k2') and ``rollout_rs_threshold`` ('0.6_1.6,2.5': one
    bound for all, or one per criterion) -> ``algorithm.rollout_rs_criteria``."""
    p = VERL_PREFIX
    names = [name.strip() for name in str(rejection).split(",") if name.strip()]
    if thresholds is None:
        raise ValueError(f"{p}rollout_rs_threshold: rollout_rs={rejection} needs its bounds (a number, 'lower_upper' "
                         "for k1 criteria, or one per criterion separated by commas)")
    specs = [part.strip() for part in str(thresholds).split(",") if part.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"{p}rollout_rs_threshold: {len(specs)} bounds for {len(names)} criteria of rollout_rs: give "
                         "one for all or one per criterion")
    criteria: dict[str, Any] = {}
    for name, spec in zip(names, specs * len(names) if len(specs) == 1 else specs):
        lower, upper = _bounds(p + "rollout_rs_threshold", _number_or_text(spec))
        criteria[name] = upper if lower is None else [lower, upper]
    parse_criteria(criteria, p + "rollout_rs")  # an unknown criterion, or bounds it cannot take: named here
    return criteria


def _number_or_text(spec: str) -> float | str:
    try:
        return float(spec)
    except ValueError:
        return spec
