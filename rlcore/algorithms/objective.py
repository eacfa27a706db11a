"""The actor's and the critic's whole objectives, shared by every training backend so none
re-implements them."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from rlcore.algorithms.aggregation import agg_loss
from rlcore.algorithms.distillation import StudentTopK, distillation_term, with_distillation
from rlcore.algorithms.kl import kl_loss
from rlcore.algorithms.rollout_correction import weigh_micro_batch
from rlcore.algorithms.value import value_loss

# ActorConfig, CriticConfig (rlcore.config.schema) and ActorSpec (rlcore.training.specs) are named in hints, never
# imported: the configuration assembles the components' tables, so it stands above them, and the specs
# are made from it.


def actor_loss(log_prob: Tensor, entropy: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
               config: ActorConfig, policy_loss, *, kl_estimator=None, ref_log_prob: Tensor | None = None,
               norm_length: int | None = None, entropy_grad: bool = True
               ) -> tuple[Tensor, dict[str, Tensor | float]]:
    """policy loss - entropy_coeff * entropy + kl_loss_coef * KL(policy || reference); all (B, T).

    Metrics: the policy loss's own, ``entropy`` and, with a KL estimator, ``kl_loss`` (before its
    coefficient). ``entropy_grad=False`` reports the entropy without putting it in the loss.
    """
    output = policy_loss(old_log_prob, log_prob, advantages, response_mask, config, norm_length=norm_length)
    loss, metrics = output.loss, dict(output.metrics)
    entropy_term = agg_loss(entropy, response_mask, config.loss_agg_mode, norm_length=norm_length)
    metrics["entropy"] = entropy_term.detach()
    if entropy_grad and config.entropy_coeff != 0:
        loss = loss - config.entropy_coeff * entropy_term
    if kl_estimator is not None:
        kl = kl_loss(log_prob, ref_log_prob, response_mask, kl_estimator, config.loss_agg_mode,
                     norm_length=norm_length)
        loss = loss + config.kl_loss_coef * kl
        metrics["kl_loss"] = kl.detach()
    return loss, metrics


def entropy_in_loss(config: ActorConfig) -> bool:
    """Whether the actor's loss has an entropy term, so its entropy needs a gradient."""
    return config.entropy_coeff != 0


def micro_batch_actor_loss(log_prob: Tensor, entropy: Tensor, columns: Callable[..., list[Tensor]],
                           spec: ActorSpec, *, on_policy: bool = False, student_top_k: StudentTopK | None = None
                           ) -> tuple[Tensor, dict[str, Tensor | float]]:
    """``actor_loss`` of one micro-batch, as the actor's ``spec`` says (its ``actor`` table, its resolved
    ``algorithms`` and ``norm_length``): ``columns(*keys)`` gives its response mask, old log-probs,
    advantages and (with a KL estimator or distillation) reference log-probs on the model's device.
    ``on_policy``: the batch has no old log-probs because this forward pass is the policy that generated
    it (``RolePlan.old_log_prob_pass``), so they are ``log_prob`` itself, detached (and with
    ``spec.algorithms.rollout_correction`` the advantages are weighted against them and the engine's
    ``rollout_log_probs``). With
    ``spec.algorithms.distillation`` the distillation term is added on the teacher's log-probs, which
    the reference role computed; under the top-k loss (``distillation.top_k``) on the teacher's
    ``ref_topk_log_probs`` and ``student_top_k``, which the backend computed from its logits at the
    teacher's ``ref_topk_ids``. Every backend's update calls this, after computing ``log_prob`` and
    ``entropy`` its own way."""
    algorithms, actor = spec.algorithms, spec.actor
    distillation, kl_estimator = algorithms.distillation, algorithms.kl_estimator
    mask, advantages = columns("response_mask", "advantages")
    old_log_prob = log_prob.detach() if on_policy else columns("old_log_probs")[0]
    correction_metrics: dict[str, Tensor | float] = {}
    if on_policy and algorithms.rollout_correction is not None:  # rollout IS against this very forward pass
        advantages, correction_metrics = weigh_micro_batch(old_log_prob, columns("rollout_log_probs")[0], advantages,
                                                           mask, algorithms.rollout_correction)
    ref_log_prob = columns("ref_log_prob")[0] if kl_estimator is not None or distillation is not None else None
    norm_length = spec.norm_length
    loss, metrics = actor_loss(log_prob, entropy, old_log_prob, advantages, mask, actor, algorithms.policy_loss,
                               kl_estimator=kl_estimator, ref_log_prob=ref_log_prob, norm_length=norm_length,
                               entropy_grad=entropy_in_loss(actor))
    metrics |= correction_metrics
    if distillation is None:
        return loss, metrics
    teacher_top_k = columns("ref_topk_log_probs")[0] if distillation.top_k else None
    term, term_metrics = distillation_term(log_prob, old_log_prob, ref_log_prob, mask, spec.distillation, actor,
                                           distillation, norm_length=norm_length, student=student_top_k,
                                           teacher_top_k=teacher_top_k)
    return with_distillation(loss, metrics, term, term_metrics, spec.distillation)


def critic_loss(values_now: Tensor, returns: Tensor, values_then: Tensor, response_mask: Tensor,
                config: CriticConfig, *, norm_length: int | None = None
                ) -> tuple[Tensor, dict[str, Tensor | float]]:
    """The clipped value loss (``critic.cliprange_value``, ``critic.loss_agg_mode``) of the values
    predicted now against the returns, clipped around the values of the rollout; all (B, T)."""
    output = value_loss(values_now, returns, values_then, response_mask, config.cliprange_value,
                        config.loss_agg_mode, norm_length=norm_length)
    return output.loss, output.metrics
