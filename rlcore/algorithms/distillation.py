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

``distillation.loss = "forward_kl_topk"`` (verl's name) is the forward KL(teacher || student) over the
teacher's top ``distillation.topk`` tokens at each response position instead: the teacher's reference
role also returns those tokens' ids and log-probs (``ref_topk_ids``, ``ref_topk_log_probs``, (B, R, K),
its log-softmax over the whole vocabulary), the actor takes its own log-softmax at those ids, and per
token sum_k p_teacher(k) (log p_teacher(k) - log p_student(k)), not renormalised over the k tokens and so
floored at 0, as verl. The training backend computes the student's side from its logits
(``student_top_k``), so it must declare ``supports_top_k_distillation``.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import Tensor

from rlcore.algorithms.aggregation import agg_loss
from rlcore.algorithms.masked import masked_mean
from rlcore.errors import RlcoreError, UnknownNameError
from rlcore.plugins.settings import Ignore as VerlIgnore
from rlcore.plugins.settings import Refuse as VerlRefuse
from rlcore.plugins.settings import VerlKeys, setting

TOP_K_LOSS = "forward_kl_topk"  # distillation.loss: the forward KL over the teacher's top-k tokens, no estimator


@attrs.frozen
class DistillationConfig:
    enable: bool = setting(False, doc="on-policy distillation: a frozen teacher scores the tokens the student "
                                      "sampled, and the student learns to lower its KL to the teacher "
                                      "(the teacher takes the reference's place)")
    teacher_path: str | None = setting(None, doc="the teacher model (Hugging Face folder); it must share the "
                                                 "student's tokenizer. With teachers: the teacher of the samples "
                                                 "whose data_source has none of its own")
    teachers: dict[str, str] = setting(
        factory=dict, doc="several teachers, one per data source: {\"openai/gsm8k\" = \"teacher folder\", ...}; "
                          "each sample is scored by its data_source's teacher (every teacher scores the whole batch "
                          "and each row keeps its own's: teacher log-prob time grows with the number of teachers). "
                          "verl: distillation.teacher_models.<name>.key and .model_path")
    loss: str = setting("k3", doc="registered KL estimator of KL(student || teacher) on each sampled token "
                                  "(k1, k3, ...; see actor.kl_loss_type), or forward_kl_topk: the forward "
                                  "KL(teacher || student) over the teacher's top distillation.topk tokens at each "
                                  "position (training backends that declare supports_top_k_distillation)")
    topk: int = setting(32, ge=1, doc="loss = forward_kl_topk: how many of the teacher's most likely tokens per "
                                      "position the KL sums over")
    coef: float = setting(1.0, ge=0.0, doc="weight of the distillation term beside the task's policy loss "
                                           "(use_task_rewards)")
    use_task_rewards: bool = setting(True, doc="keep the task's policy loss on the advantages and add the "
                                               "distillation term; false: the distillation term is the whole loss")
    use_policy_gradient: bool = setting(False, doc="take -KL per token as the advantage of a policy-gradient loss "
                                                   "(distillation.policy_loss) instead of backpropagating the KL")
    policy_loss: str = setting("vanilla", doc="registered policy loss of use_policy_gradient")
    clip_ratio: float = setting(0.2, ge=0.0, doc="use_policy_gradient: the clip range of that loss")
    clip_ratio_low: float | None = setting(None, ge=0.0, doc="use_policy_gradient: lower clip range "
                                                             "(default: clip_ratio)")
    clip_ratio_high: float | None = setting(None, ge=0.0, doc="use_policy_gradient: upper clip range "
                                                              "(default: clip_ratio)")
    loss_max_clamp: float | None = setting(None, gt=0.0, doc="clamp each token's KL estimate to +-this; None: no clamp")
    log_prob_min_clamp: float | None = setting(None, doc="clamp student and teacher log-probs below at this "
                                                         "before the KL; None: no clamp")


TOP_K_COLUMNS = ("ref_topk_ids", "ref_topk_log_probs")  # what the teacher adds for it, each (B, R, K)


@attrs.frozen
class Distillation:
    """The registered objects the distillation term uses, resolved by the driver."""

    estimator: Any | None  # a registered KL estimator: (student_log_prob, teacher_log_prob) -> (B, T); None: top-k
    policy_loss: Any | None  # a registered policy loss, with use_policy_gradient
    top_k: int = 0  # with distillation.loss = forward_kl_topk: distillation.topk; else 0


@attrs.frozen
class StudentTopK:
    """The student's side of the top-k forward KL, computed by the backend from its logits."""

    log_probs: Tensor  # (B, R, K) the student's log-softmax at the teacher's top-k ids (with its graph)
    overlap: Tensor  # (B, R) how many of the teacher's top-k ids are among the student's own top k


def resolve_distillation(config, manager) -> Distillation | None:
    """The estimator (and policy loss) ``[distillation]`` names; None when distillation is off."""
    settings = config.distillation
    if not settings.enable:
        return None
    top_k = settings.loss == TOP_K_LOSS
    return Distillation(estimator=None if top_k else manager.get("kl_estimators", settings.loss),
                        policy_loss=manager.get("policy_losses", settings.policy_loss)
                        if settings.use_policy_gradient else None,
                        top_k=settings.topk if top_k else 0)


def teacher_top_k(config) -> int:
    """How many top tokens per position the reference (the teacher) returns beside ``ref_log_prob``:
    ``distillation.topk`` under the top-k loss, else 0."""
    settings = config.distillation
    return settings.topk if settings.enable and settings.loss == TOP_K_LOSS else 0


def top_k_log_probs(logits: Tensor, k: int, temperature: float) -> tuple[Tensor, Tensor]:
    """The teacher's side: (..., V) logits -> its k most likely tokens' fp32 log-probs (..., K) at
    ``temperature`` (log-softmax over the whole vocabulary) and their ids (..., K), most likely first."""
    log_probs = (logits.float() / temperature).log_softmax(-1)
    values, ids = log_probs.topk(min(k, log_probs.shape[-1]), dim=-1)
    return values, ids


def student_top_k(logits: Tensor, teacher_ids: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """The student's side: (..., V) logits and the teacher's (..., K) ids -> the student's fp32
    log-probs at those ids (..., K), with the logits' graph, and the overlap (...): how many of those
    ids are among the student's own top K (verl's overlap diagnostic)."""
    log_probs = (logits.float() / temperature).log_softmax(-1)
    at_teacher = log_probs.gather(-1, teacher_ids)
    with torch.no_grad():
        own = log_probs.topk(teacher_ids.shape[-1], dim=-1).indices  # (..., K)
        overlap = (teacher_ids.unsqueeze(-1) == own.unsqueeze(-2)).any(-1).sum(-1)
    return at_teacher, overlap


def forward_kl_top_k(student: Tensor, teacher: Tensor) -> Tensor:
    """sum_k p_teacher(k) (log p_teacher(k) - log p_student(k)) over the last dim, (B, R, K) log-probs ->
    (B, R): the forward KL restricted to the teacher's top k, not renormalised; the two masses there
    differ, so it can be negative, and is floored at 0 (as verl)."""
    return (teacher.exp() * (teacher - student)).sum(-1).clamp_min(0.0)


def reference_model_path(config) -> str:
    """The model the reference role loads: the teacher under distillation, else the initial policy."""
    return config.distillation.teacher_path if config.distillation.enable else config.model.path


def reference_model_overrides(config) -> dict[str, Any]:
    """The Hugging Face config values the reference sets over its model's: the policy's
    ``model.override_config`` for the initial policy; none for a teacher, a model of its own."""
    return {} if config.distillation.enable else dict(config.model.override_config)


def _top_k_per_token(student: StudentTopK | None, teacher_top_k: Tensor | None, response_mask: Tensor,
                     settings: DistillationConfig, k: int) -> tuple[Tensor, dict[str, Tensor]]:
    """The forward KL over the teacher's top k per token (B, T), and the masses and overlap metrics."""
    if student is None or teacher_top_k is None:
        raise RlcoreError(f"distillation.loss = {TOP_K_LOSS!r} needs the student's log-probs at the teacher's "
                          "top-k tokens and the teacher's ref_topk_log_probs; this training backend did not give "
                          "them (it must declare supports_top_k_distillation)")
    student_lp, teacher_lp = student.log_probs, teacher_top_k.to(student.log_probs.dtype)  # (B, T, K)
    metrics = {"distillation_student_mass": masked_mean(student_lp.detach().exp().sum(-1), response_mask),
               "distillation_teacher_mass": masked_mean(teacher_lp.detach().exp().sum(-1), response_mask),
               "distillation_overlap_ratio": masked_mean(student.overlap.float(), response_mask) / k}
    if settings.log_prob_min_clamp is not None:
        floor = settings.log_prob_min_clamp
        student_lp, teacher_lp = student_lp.clamp(min=floor), teacher_lp.clamp(min=floor)
    return forward_kl_top_k(student_lp, teacher_lp), metrics


def distillation_term(log_prob: Tensor, old_log_prob: Tensor, teacher_log_prob: Tensor, response_mask: Tensor,
                      settings: DistillationConfig, actor: ActorConfig, distillation: Distillation, *,
                      norm_length: int | None = None, student: StudentTopK | None = None,
                      teacher_top_k: Tensor | None = None
                      ) -> tuple[Tensor, dict[str, Tensor]]:
    """The distillation loss term of one micro-batch, all (B, T), before ``coef``, from ``[distillation]``'s
    ``settings`` and the ``[actor]`` table (its loss_agg_mode; the clip ratios of use_policy_gradient); metrics
    ``distillation_loss`` (the term), ``distillation_kl`` (the mean of log p_student - log p_teacher
    over response tokens: the k1 estimate of KL(student || teacher), whatever the loss) and
    ``distillation_abs_kl`` (the mean of the per-token loss's absolute value, as verl's abs_loss). Under
    the top-k loss ``student`` and ``teacher_top_k`` (``ref_topk_log_probs``, (B, T, K)) are its inputs,
    and the metrics add the probability mass of the teacher's top k under each model
    (``distillation_student_mass``, ``distillation_teacher_mass``) and ``distillation_overlap_ratio``
    (the share of the teacher's top k among the student's own top k)."""
    extra: dict[str, Tensor] = {}
    if distillation.top_k:
        per_token, extra = _top_k_per_token(student, teacher_top_k, response_mask, settings, distillation.top_k)
    else:
        student_lp, teacher_lp = log_prob, teacher_log_prob.to(log_prob.dtype)
        if settings.log_prob_min_clamp is not None:
            floor = settings.log_prob_min_clamp
            student_lp, teacher_lp = student_lp.clamp(min=floor), teacher_lp.clamp(min=floor)
        per_token = distillation.estimator(student_lp, teacher_lp)  # (B, T)
    if settings.loss_max_clamp is not None:  # both sides: k1 can be negative
        per_token = per_token.clamp(-settings.loss_max_clamp, settings.loss_max_clamp)
    if distillation.policy_loss is not None:
        clipped = attrs.evolve(actor, clip_ratio=settings.clip_ratio, clip_ratio_low=settings.clip_ratio_low,
                               clip_ratio_high=settings.clip_ratio_high)
        output = distillation.policy_loss(old_log_prob, log_prob, -per_token.detach(), response_mask, clipped,
                                          norm_length=norm_length)
        term = output.loss
    else:
        term = agg_loss(per_token, response_mask, actor.loss_agg_mode, norm_length=norm_length)
    metrics = {
        "distillation_loss": term.detach(),
        "distillation_kl": masked_mean(log_prob.detach() - teacher_log_prob.detach(), response_mask),
        "distillation_abs_kl": masked_mean(per_token.detach().abs(), response_mask),
        **extra,
    }
    return term, metrics


def with_distillation(task_loss: Tensor, metrics: dict[str, Tensor | float], term: Tensor,
                      term_metrics: dict[str, Tensor | float], settings: DistillationConfig
                      ) -> tuple[Tensor, dict[str, Tensor | float]]:
    """The actor's loss with the distillation term: added times ``coef`` beside the task's loss
    (``use_task_rewards``), or in its place."""
    loss = task_loss + settings.coef * term if settings.use_task_rewards else term
    return loss, {**metrics, **term_metrics}


# --- the job's checks of [distillation] (registered by rlcore.algorithms.plugin) -------------------


def problems(job) -> list[str]:
    """Errors of the [distillation] table (a teacher, no KL to the initial policy beside it), each naming its key."""
    config = job.config
    settings = config.distillation
    problems = []
    if settings.loss != TOP_K_LOSS:  # the top-k loss is no estimator; any other names a registered one
        try:
            job.manager.registry("kl_estimators").entry(settings.loss)
        except UnknownNameError as exc:
            problems.append(f"distillation.loss: {exc}")
    if not settings.enable:
        return problems
    if not settings.teacher_path and not settings.teachers:
        problems.append("distillation.enable: set distillation.teacher_path, the teacher model's folder (verl: "
                        "distillation.teacher_models.teacher_model.model_path), or distillation.teachers, one "
                        "teacher per data source")
    kl_terms = [key for key, on in (("actor.use_kl_loss", config.actor.use_kl_loss),
                                    ("algorithm.use_kl_in_reward", config.algorithm.use_kl_in_reward)) if on]
    if kl_terms:
        problems.append(f"distillation.enable: the teacher takes the reference's place, so {' and '.join(kl_terms)} "
                        "(a KL to the initial policy) cannot be on beside it; turn it off")
    return problems


def unused(job) -> list[str]:
    """Warnings for [distillation] settings given while distillation is off."""
    warnings = []
    if not job.config.distillation.enable:
        for key in job.given("distillation"):
            if key not in job.tables and key != "distillation.enable":
                warnings.append(f"{key} has no effect while distillation.enable is false")
    return warnings


# verl's keys of [distillation]: one teacher in the reference's place (the rest of distillation_loss.* keep
# their names); several named teachers: their key and model_path become distillation.teachers
# (rlcore.config.overrides)
VERL_KEYS = VerlKeys(aliases=(
    ("distillation.enabled", "distillation.enable"),
    ("distillation.teacher_models.teacher_model.model_path", "distillation.teacher_path"),
    ("distillation.distillation_loss.loss_mode", "distillation.loss"),
    ("distillation.distillation_loss.distillation_loss_coef", "distillation.coef"),
    ("distillation.distillation_loss.policy_loss_mode", "distillation.policy_loss"),
    ("distillation.distillation_loss.", "distillation."),
), rules=(
    (("distillation.teacher_models.*.inference.temperature",),
     VerlIgnore("derived", "the teacher scores at rollout.temperature, as the reference does")),
    (("distillation.teacher_models.*.inference.*", "distillation.teacher_models.*.num_replicas",
      "distillation.n_gpus_per_node", "distillation.nnodes"),
     VerlIgnore("machinery", "the teacher computes its log-probs in rlcore's training workers, in the reference's "
                             "place, not in an inference server or a pool of its own")),
    (("distillation.teacher_models.teacher_model.key", "distillation.teacher_key"),
     VerlRefuse("one teacher (distillation.teacher_path) scores every sample; routing samples to several teachers "
                "is not implemented in rlcore yet", (None, "data_source"))),
    (("distillation.teacher_models.teacher_model.model_path",), None),
    (("distillation.teacher_models.*",),
     VerlRefuse("give each teacher a key (the data_source of its samples) and a model_path, one teacher per data "
                "source (distillation.teachers); one teacher for every sample: distillation.teacher_path", (None,))),
))
