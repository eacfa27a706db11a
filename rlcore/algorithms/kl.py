"""KL to the reference policy: per-token estimators, the in-reward penalty and its controllers.

Estimators are registered by name (``actor.kl_loss_type``, ``algorithm.kl_penalty``) as callables
``(log_prob, ref_log_prob) -> kl`` on (B, T) tensors; see http://joschu.net/blog/kl-approx.html.
A name with ``+`` appended (``k3+``) is straight-through: its value, the gradient of ``k2``, which
is the unbiased gradient of KL that ``k1`` and ``k3`` are not (verl does the same).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import torch
from torch import Tensor

from rlcore.algorithms.aggregation import agg_loss
from rlcore.algorithms.masked import as_mask, masked_mean

if TYPE_CHECKING:
    from rlcore.algorithms.config import KlControl

KLEstimator = Callable[[Tensor, Tensor], Tensor]


def kl_k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """log p - log p_ref: unbiased, high variance, can be negative."""
    return log_prob.float() - ref_log_prob.float()


def kl_abs(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """|log p - log p_ref|."""
    return kl_k1(log_prob, ref_log_prob).abs()


def kl_k2(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """(log p - log p_ref)^2 / 2: biased, low variance, the right gradient."""
    return 0.5 * kl_k1(log_prob, ref_log_prob).square()


def kl_k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """exp(-d) + d - 1 with d = log p - log p_ref: unbiased, low variance, never negative.

    As verl: d is clamped to [-20, 20] so exp() stays finite, and the result to [-10, 10].
    """
    log_ref_ratio = (ref_log_prob.float() - log_prob.float()).clamp(-20.0, 20.0)
    return (log_ref_ratio.exp() - log_ref_ratio - 1.0).clamp(-10.0, 10.0)


def straight_through(estimator: KLEstimator) -> KLEstimator:
    """The estimator's value with the gradient of ``k2``."""

    def kl(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
        k2 = kl_k2(log_prob, ref_log_prob)
        return k2 - k2.detach() + estimator(log_prob, ref_log_prob).detach()

    kl.__name__ = kl.__qualname__ = f"{estimator.__name__}_straight_through"
    kl.__doc__ = f"Value of {estimator.__name__}, gradient of kl_k2."
    return kl


_BASE = {"kl": kl_k1, "k1": kl_k1, "abs": kl_abs, "mse": kl_k2, "k2": kl_k2, "low_var_kl": kl_k3, "k3": kl_k3}
KL_ESTIMATORS: dict[str, KLEstimator] = {**_BASE, **{f"{n}+": straight_through(f) for n, f in _BASE.items()}}


def kl_loss(log_prob: Tensor, ref_log_prob: Tensor, response_mask: Tensor, estimator: KLEstimator,
            loss_agg_mode: str, *, norm_length: int | None = None) -> Tensor:
    """KL as a loss term (``actor.use_kl_loss``), aggregated like the policy loss; times kl_loss_coef."""
    return agg_loss(estimator(log_prob, ref_log_prob), response_mask, loss_agg_mode, norm_length=norm_length)


@attrs.define
class FixedKLController:
    """A constant in-reward KL coefficient."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


@attrs.define
class AdaptiveKLController:
    """Moves the coefficient toward ``target`` KL over ``horizon`` samples (Ziegler et al. 2019,
    https://arxiv.org/abs/1909.08593); the step is capped at +-20% of the error per horizon."""

    value: float
    target: float
    horizon: int

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def kl_controller(config: KlControl) -> FixedKLController | AdaptiveKLController:
    """The controller ``algorithm.kl_ctrl`` describes."""
    if config.type == "adaptive":
        return AdaptiveKLController(config.kl_coef, config.target_kl, config.horizon)
    if config.type == "fixed":
        return FixedKLController(config.kl_coef)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {config.type!r}; known: fixed, adaptive")


@torch.no_grad()
def apply_kl_penalty(token_level_scores: Tensor, old_log_prob: Tensor, ref_log_prob: Tensor,
                     response_mask: Tensor, controller: FixedKLController | AdaptiveKLController,
                     estimator: KLEstimator) -> tuple[Tensor, dict[str, float]]:
    """KL in the reward (``algorithm.use_kl_in_reward``): scores - coef * kl per token, (B, T).

    Then updates the controller with this batch's KL (mean over samples of each sample's mean over
    its tokens), as verl does. Metrics: ``actor/reward_kl_penalty`` and ``..._coeff`` (the coef used).
    """
    mask = as_mask(response_mask)
    kl = torch.where(mask, estimator(old_log_prob, ref_log_prob), 0.0)  # (B, T)
    coef = controller.value
    rewards = torch.where(mask, token_level_scores.float() - coef * kl, token_level_scores.float())
    samples = mask.any(-1)  # (B,) rows with response tokens; padding rows are not samples
    current_kl = float(masked_mean(masked_mean(kl, mask, dim=-1), samples))
    controller.update(current_kl, int(samples.sum()))
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": coef}


# --- the job's checks of the KL settings (registered by rlcore.algorithms.plugin) -------------------


def kl_unused(job) -> list[str]:
    """KL settings given while their term is off."""
    config, warnings = job.config, []
    if not config.actor.use_kl_loss:
        for key in job.given("actor.kl_loss_coef") + job.given("actor.kl_loss_type"):
            warnings.append(f"{key} has no effect while actor.use_kl_loss is false")
    if not config.algorithm.use_kl_in_reward:
        for key in job.given("algorithm.kl_ctrl") + job.given("algorithm.kl_penalty"):
            if key != "algorithm.kl_ctrl":
                warnings.append(f"{key} has no effect while algorithm.use_kl_in_reward is false")
    return warnings
