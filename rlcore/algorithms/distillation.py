"""On-policy distillation (``[distillation]``, verl's ``distillation.*``): the student samples, a frozen
teacher scores the student's tokens, and the student lowers its KL to the teacher on its own samples.

Per response token the registered KL estimator (``distillation.loss``) of KL(student || teacher) is taken
at the token the student sampled: the reverse KL, which the student's own samples estimate without the
teacher's whole distribution (k1 = log p_student - log p_teacher; k3 its low-variance form). It trains the
student one of two ways:

- directly (default): the estimate, aggregated like the policy loss, is a loss term whose gradient flows
  through the student's log-probs (Agarwal et al., GKD, https://arxiv.org/abs/2306.13649);
- ``use_policy_gradient``: -estimate per token (no gradient) is the advantage of a policy-gradient loss
  (``distillation.policy_loss`` with the distillation clip ranges), as in Thinking Machines' on-policy
  distillation (https://thinkingmachines.ai/blog/on-policy-distillation/).

With ``use_task_rewards`` the term is added, times ``coef``, to the task's loss (policy loss on the
advantages, entropy, KL); without, it is the whole loss. The teacher's log-probs are the reference
role's (``ref_log_prob``): the reference loads ``distillation.teacher_path`` instead of ``model.path``.
"""

from __future__ import annotations

from typing import Any

import attrs
from torch import Tensor

from rlcore.algorithms.aggregation import agg_loss
from rlcore.algorithms.masked import masked_mean
from rlcore.config.schema import DistillationConfig, JobConfig


@attrs.frozen
class Distillation:
    """The registered objects the distillation term uses, resolved by the driver."""

    estimator: Any  # a registered KL estimator: (student_log_prob, teacher_log_prob) -> (B, T)
    policy_loss: Any | None  # a registered policy loss, with use_policy_gradient


def resolve_distillation(config: JobConfig, manager) -> Distillation | None:
    """The estimator (and policy loss) ``[distillation]`` names; None when distillation is off."""
    settings = config.distillation
    if not settings.enable:
        return None
    return Distillation(estimator=manager.get("kl_estimators", settings.loss),
                        policy_loss=manager.get("policy_losses", settings.policy_loss)
                        if settings.use_policy_gradient else None)


def reference_model_path(config: JobConfig) -> str:
    """The model the reference role loads: the teacher under distillation, else the initial policy."""
    return config.distillation.teacher_path if config.distillation.enable else config.model.path


def reference_model_overrides(config: JobConfig) -> dict[str, Any]:
    """The Hugging Face config values the reference sets over its model's: the policy's
    ``model.override_config`` for the initial policy; none for a teacher, a model of its own."""
    return {} if config.distillation.enable else dict(config.model.override_config)


def distillation_term(log_prob: Tensor, old_log_prob: Tensor, teacher_log_prob: Tensor, response_mask: Tensor,
                      config: JobConfig, distillation: Distillation, *, norm_length: int | None = None
                      ) -> tuple[Tensor, dict[str, float]]:
    """The distillation loss term of one micro-batch, all (B, T), before ``coef``; metrics
    ``distillation_loss`` (the term), ``distillation_kl`` (the mean of log p_student - log p_teacher
    over response tokens: the k1 estimate of KL(student || teacher), whatever the estimator) and
    ``distillation_abs_kl`` (the mean of the estimator's absolute value, as verl's abs_loss)."""
    settings: DistillationConfig = config.distillation
    student, teacher = log_prob, teacher_log_prob.to(log_prob.dtype)
    if settings.log_prob_min_clamp is not None:
        floor = settings.log_prob_min_clamp
        student, teacher = student.clamp(min=floor), teacher.clamp(min=floor)
    per_token = distillation.estimator(student, teacher)  # (B, T)
    if settings.loss_max_clamp is not None:  # both sides: k1 can be negative
        per_token = per_token.clamp(-settings.loss_max_clamp, settings.loss_max_clamp)
    actor = config.actor
    if distillation.policy_loss is not None:
        clipped = attrs.evolve(actor, clip_ratio=settings.clip_ratio, clip_ratio_low=settings.clip_ratio_low,
                               clip_ratio_high=settings.clip_ratio_high)
        output = distillation.policy_loss(old_log_prob, log_prob, -per_token.detach(), response_mask, clipped,
                                          norm_length=norm_length)
        term = output.loss
    else:
        term = agg_loss(per_token, response_mask, actor.loss_agg_mode, norm_length=norm_length)
    metrics = {
        "distillation_loss": float(term.detach()),
        "distillation_kl": float(masked_mean(log_prob.detach() - teacher_log_prob.detach(), response_mask)),
        "distillation_abs_kl": float(masked_mean(per_token.detach().abs(), response_mask)),
    }
    return term, metrics


def with_distillation(task_loss: Tensor, metrics: dict[str, float], term: Tensor, term_metrics: dict[str, float],
                      settings: DistillationConfig) -> tuple[Tensor, dict[str, float]]:
    """The actor's loss with the distillation term: added times ``coef`` beside the task's loss
    (``use_task_rewards``), or in its place."""
    loss = task_loss + settings.coef * term if settings.use_task_rewards else term
    return loss, {**metrics, **term_metrics}
