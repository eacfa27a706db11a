"""Policy losses, registered by name (``actor.policy_loss``; verl's ``policy_loss.loss_mode``).

Every loss has one calling shape::

    loss(old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None) -> PolicyLossOutput

with (B, T) tensors and ``config`` the ``ActorConfig``; ``norm_length`` is passed to ``agg_loss`` for
``seq-mean-token-sum-norm``. Each aggregates with ``config.loss_agg_mode`` and reports ``pg_loss``,
``pg_clipfrac``, ``pg_clipfrac_lower`` and ``ppo_kl`` (mean of old - new log-prob over tokens; for
``kl_cov`` the mean of |new - old|, as verl). Formulas follow verl 0.9.1's ``core_algos.py`` (checked
against it by ``tests/algorithms/test_verl_parity.py``); all arithmetic is fp32.

The log-ratio is clamped to [-20, 20] where verl clamps it (vanilla, cispo, sapo, the dppo losses).
gspo, gpg, clip_cov, kl_cov and geo_mean read it unclamped, as verl; only ``_saturating_exp`` keeps
their ratio below fp32's overflow, which changes nothing where verl's ratio is finite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs
import torch
from torch import Tensor

from rlcore.algorithms.aggregation import agg_loss
from rlcore.algorithms.masked import as_mask, masked_mean

# ActorConfig (rlcore.config.schema) is named in hints, never imported: the configuration assembles the
# components' tables, so it stands above them.

LOG_RATIO_LIMIT = 20.0  # verl's clamp in vanilla, cispo, sapo and dppo: exp(20) is finite in fp32
# the largest fp32 x whose exp is finite: exp(min(x, this)) equals exp(x) wherever that is finite
EXP_FINITE_MAX = float(torch.tensor(torch.finfo(torch.float32).max).log().nextafter(torch.tensor(0.0)))
GSPO_LOG_RATIO_MAX = 10.0


@attrs.frozen
class PolicyLossOutput:
    loss: Tensor  # scalar, differentiable in log_prob
    # pg_loss, pg_clipfrac, pg_clipfrac_lower, ppo_kl: numbers, or 0-d tensors the update reads once a step
    # (rlcore.metrics.read_metrics), so that it never waits for the device between micro-batches
    metrics: dict[str, Tensor | float]


class PolicyLoss(Protocol):
    def __call__(self, old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
                 config: ActorConfig, *, norm_length: int | None = None) -> PolicyLossOutput: ...


def clip_range(config: ActorConfig) -> tuple[float, float]:
    """(low, high): the ratio is clipped to [1 - low, 1 + high]; each defaults to ``clip_ratio``."""
    low = config.clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    high = config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    return low, high


def _output(loss: Tensor, clipfrac: Tensor | float, clipfrac_lower: Tensor | float, ppo_kl: Tensor) -> PolicyLossOutput:
    metrics = {"pg_loss": loss, "pg_clipfrac": clipfrac, "pg_clipfrac_lower": clipfrac_lower, "ppo_kl": ppo_kl}
    return PolicyLossOutput(loss, {k: v.detach() if isinstance(v, Tensor) else v for k, v in metrics.items()})


def _clip(ratio: Tensor, advantages: Tensor, config: ActorConfig) -> tuple[Tensor, Tensor]:
    """(-A * ratio, -A * clip(ratio, 1 - low, 1 + high)): PPO's two candidate losses per token."""
    low, high = clip_range(config)
    return -advantages * ratio, -advantages * ratio.clamp(1.0 - low, 1.0 + high)


def _log_ratio(old_log_prob: Tensor, log_prob: Tensor) -> Tensor:
    """log(new / old) per token (B, T), clamped to +-LOG_RATIO_LIMIT as verl's clamping losses do."""
    return _raw_log_ratio(old_log_prob, log_prob).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def _raw_log_ratio(old_log_prob: Tensor, log_prob: Tensor) -> Tensor:
    """log(new / old) per token (B, T), unclamped: what gspo, clip_cov, kl_cov and geo_mean read in verl."""
    return log_prob.float() - old_log_prob.float()


def _saturating_exp(x: Tensor) -> Tensor:
    """exp(x), the largest finite fp32 instead of inf: equal to verl's exp (value and gradient)
    wherever verl's is finite; past that, verl's loss or its gradient is inf or NaN."""
    return x.clamp(max=EXP_FINITE_MAX).exp()


def vanilla(old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None) -> PolicyLossOutput:
    """PPO clip with separate low/high ranges (DAPO clip-higher) and dual-clip for negative advantages."""
    mask = as_mask(response_mask)
    advantages = advantages.float()
    log_ratio = _log_ratio(old_log_prob, log_prob)
    unclipped, clipped = _clip(log_ratio.exp(), advantages, config)
    pessimistic = torch.maximum(unclipped, clipped)
    # dual clip: with A < 0 a huge ratio would give an unbounded loss; cap it at -A * clip_ratio_c
    capped = -advantages * config.clip_ratio_c
    per_token = torch.where(advantages < 0, torch.minimum(pessimistic, capped), pessimistic)
    loss = agg_loss(per_token, mask, config.loss_agg_mode, norm_length=norm_length)
    return _output(
        loss,
        masked_mean((clipped > unclipped).float(), mask),
        masked_mean(((pessimistic > capped) & (advantages < 0)).float(), mask),
        masked_mean(-log_ratio, mask),
    )


def gspo(old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None) -> PolicyLossOutput:
    """GSPO: one importance ratio per sequence (geometric mean of its tokens' ratios), clipped."""
    mask = as_mask(response_mask)
    advantages = advantages.float()
    log_prob = log_prob.float()
    log_ratio = _raw_log_ratio(old_log_prob, log_prob)  # verl does not clamp it before the mean
    seq_log_ratio = masked_mean(log_ratio, mask, dim=-1)  # (B,)
    # value of the sequence ratio, gradient of each token's own log-prob (the paper's GSPO-token form)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    unclipped, clipped = _clip(token_log_ratio.clamp(max=GSPO_LOG_RATIO_MAX).exp(), advantages, config)
    loss = agg_loss(torch.maximum(unclipped, clipped), mask, config.loss_agg_mode, norm_length=norm_length)
    return _output(loss, masked_mean((clipped > unclipped).float(), mask), 0.0, masked_mean(-log_ratio, mask))


def gpg(old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None) -> PolicyLossOutput:
    """GPG: plain policy gradient, -log_prob * A, no ratio and no clipping."""
    mask = as_mask(response_mask)
    per_token = -log_prob.float() * advantages.float()
    loss = agg_loss(per_token, mask, config.loss_agg_mode, norm_length=norm_length)
    return _output(loss, 0.0, 0.0, masked_mean(-_raw_log_ratio(old_log_prob, log_prob), mask))


def _covariance(advantages: Tensor, log_prob: Tensor, mask: Tensor) -> Tensor:
    """Per-token (A - mean A) * (log p - mean log p) over the batch's response tokens (B, T)."""
    log_prob = log_prob.detach().float()
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


def _how_many(ratio: float, tokens: int) -> int:
    """verl picks at least one token when the ratio is positive; a ratio of 0 picks none."""
    return 0 if ratio <= 0 or tokens == 0 else max(int(ratio * tokens), 1)


def clip_cov(old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None) -> PolicyLossOutput:
    """Clip-Cov: PPO clip, plus a random few tokens whose covariance of A and log p lies in
    (clip_cov_lb, clip_cov_ub) get no gradient at all (keeps entropy from collapsing)."""
    mask = as_mask(response_mask)
    advantages = advantages.float()
    log_ratio = _raw_log_ratio(old_log_prob, log_prob)
    unclipped, clipped = _clip(_saturating_exp(log_ratio), advantages, config)
    covariance = _covariance(advantages, log_prob, mask)
    candidates = mask & ~(clipped > unclipped) & (covariance > config.clip_cov_lb) & (covariance < config.clip_cov_ub)
    chosen = candidates.nonzero()  # (N, 2)
    count = min(_how_many(config.clip_cov_ratio, int(mask.sum())), len(chosen))
    chosen = chosen[torch.randperm(len(chosen), device=chosen.device)[:count]]
    dropped = torch.zeros_like(mask)
    dropped[chosen[:, 0], chosen[:, 1]] = True
    per_token = torch.where(dropped, 0.0, torch.maximum(unclipped, clipped))
    loss = agg_loss(per_token, mask, config.loss_agg_mode, norm_length=norm_length)
    return _output(loss, masked_mean(dropped.float(), mask), 0.0, masked_mean(-log_ratio, mask))


def kl_cov(old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None) -> PolicyLossOutput:
    """KL-Cov: unclipped policy gradient; the tokens with the largest covariance of A and log p
    (a kl_cov_ratio fraction) also pay ppo_kl_coef * |log ratio|."""
    mask = as_mask(response_mask)
    advantages = advantages.float()
    log_ratio = _raw_log_ratio(old_log_prob, log_prob)
    per_token = -advantages * _saturating_exp(log_ratio)
    covariance = _covariance(advantages, log_prob, mask)
    tokens = mask.flatten().nonzero().squeeze(-1)  # (N,) flat indices of response tokens
    count = _how_many(config.kl_cov_ratio, len(tokens))
    if count:
        top = tokens[covariance.flatten()[tokens].topk(count).indices]
        penalised = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
        penalised[top] = True
        penalty = config.ppo_kl_coef * log_ratio.abs()
        per_token = torch.where(penalised.view_as(mask), per_token + penalty, per_token)
    loss = agg_loss(per_token, mask, config.loss_agg_mode, norm_length=norm_length)
    # verl's kl_cov reports the mean absolute log-ratio as ppo_kl
    return _output(loss, 0.0, 0.0, masked_mean(log_ratio.abs(), mask))


def cispo(old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None) -> PolicyLossOutput:
    """CISPO: -sg(clip(ratio, 1 - low, 1 + high)) * A * log_prob: the clipped ratio only weighs the
    token, so a clipped token still gets the gradient of its log-prob. A clip_ratio_low of 1 or more
    leaves the ratio unclipped from below."""
    mask = as_mask(response_mask)
    advantages = advantages.float()
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = log_ratio.exp()
    low, high = clip_range(config)
    weight = ratio.clamp(1.0 - low, 1.0 + high).detach()
    per_token = -weight * advantages * log_prob.float()
    loss = agg_loss(per_token, mask, config.loss_agg_mode, norm_length=norm_length)
    return _output(loss, masked_mean((weight != ratio.detach()).float(), mask), 0.0, masked_mean(-log_ratio, mask))


cispo.unbounded_lower_clip = True  # clip_ratio_low >= 1 is meaningful here: no lower bound


def geo_mean(old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None) -> PolicyLossOutput:
    """GMPO: one ratio per sequence, the geometric mean of its tokens' ratios, each token's log-ratio
    first clipped to [-low, high] on the side its advantage's sign makes pessimistic; the loss is
    -A_seq * ratio_seq (A_seq: the sequence's mean advantage), one value a sequence, spread evenly
    over its tokens so that ``seq-mean-token-mean`` gives the mean over sequences."""
    mask = as_mask(response_mask)
    advantages = advantages.float()
    log_ratio = _raw_log_ratio(old_log_prob, log_prob)
    low, high = clip_range(config)
    sign = advantages.sign()
    clipped = log_ratio.clamp(-low, high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    seq_ratio = _saturating_exp(masked_mean(pessimistic, mask, dim=-1))  # (B,)
    seq_advantage = masked_mean(advantages, mask, dim=-1)  # (B,)
    per_token = (-seq_advantage * seq_ratio).unsqueeze(-1).expand_as(log_ratio)
    loss = agg_loss(per_token, mask, config.loss_agg_mode, norm_length=norm_length)
    was_clipped = log_ratio != clipped
    return _output(loss, masked_mean((was_clipped & (advantages > 0)).float(), mask),
                   masked_mean((was_clipped & (advantages < 0)).float(), mask), masked_mean(-log_ratio, mask))


def sapo(old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None) -> PolicyLossOutput:
    """SAPO: a smooth gate instead of a hard clip, -A * (4 / tau) * sigmoid(tau * (ratio - 1)), with
    tau = tau_pos for tokens of positive advantage and tau_neg for the others (its gradient at
    ratio 1 is the plain policy gradient's)."""
    mask = as_mask(response_mask)
    advantages = advantages.float()
    log_ratio = _log_ratio(old_log_prob, log_prob)
    tau = torch.where(advantages > 0, config.tau_pos, config.tau_neg)
    gate = torch.sigmoid(tau * (log_ratio.exp() - 1.0)) * (4.0 / tau)
    loss = agg_loss(-gate * advantages, mask, config.loss_agg_mode, norm_length=norm_length)
    return _output(loss, 0.0, 0.0, masked_mean(-log_ratio, mask))


def _divergence_masked(old_log_prob, log_prob, advantages, response_mask, config, norm_length,
                       inside: Tensor) -> PolicyLossOutput:
    """DPPO's shared objective: -A * sg(min(ratio, clip_ratio_c)) * log_prob on the tokens ``inside``
    the trust region, none elsewhere. The ratio is truncated (truncated importance sampling) rather
    than dual-clipped; ``pg_clipfrac`` is the share of tokens outside the region, ``pg_clipfrac_lower``
    the share inside it whose ratio was truncated."""
    mask = as_mask(response_mask)
    advantages = advantages.float()
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = log_ratio.exp().detach()
    inside = inside.detach()
    weight = ratio.clamp(max=config.clip_ratio_c)
    per_token = torch.where(inside, -advantages * weight * log_prob.float(), 0.0)
    loss = agg_loss(per_token, mask, config.loss_agg_mode, norm_length=norm_length)
    truncated = (ratio > config.clip_ratio_c) & inside
    return _output(loss, masked_mean((~inside).float(), mask), masked_mean(truncated.float(), mask),
                   masked_mean(-log_ratio, mask))


def dppo_tv(old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None) -> PolicyLossOutput:
    """DPPO-Binary-TV (arXiv:2602.04879): the trust region bounds the change of the token's own
    probability, p - p_old <= clip_ratio_high for A > 0 and >= -clip_ratio_low otherwise; a token
    outside it gets no gradient. Inside, the loss is ``_divergence_masked``'s truncated policy gradient.
    The clip ranges are divergence thresholds here, not ratio ranges."""
    low, high = clip_range(config)
    change = log_prob.detach().float().exp() - old_log_prob.float().exp()
    inside = torch.where(advantages > 0, change <= high, change >= -low)
    return _divergence_masked(old_log_prob, log_prob, advantages, response_mask, config, norm_length, inside)


BINARY_KL_EPS = 1e-8  # keeps log((1 - p_old) / (1 - p)) finite when a probability reaches 1


def dppo_kl(old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None) -> PolicyLossOutput:
    """DPPO-Binary-KL: as ``dppo_tv``, with the region bounded by the KL divergence between the
    Bernoulli distributions (p_old, 1 - p_old) and (p, 1 - p): for A > 0 a token whose probability
    rose leaves the region once that KL exceeds clip_ratio_high; for A <= 0 one whose probability fell,
    once it exceeds clip_ratio_low."""
    low, high = clip_range(config)
    new_lp, old_lp = log_prob.detach().float(), old_log_prob.float()
    new_p, old_p = new_lp.exp(), old_lp.exp()
    binary_kl = old_p * (old_lp - new_lp) + (1.0 - old_p) * torch.log(
        (1.0 - old_p + BINARY_KL_EPS) / (1.0 - new_p + BINARY_KL_EPS))
    inside = torch.where(advantages > 0, (binary_kl <= high) | (new_p <= old_p), (binary_kl <= low) | (new_p >= old_p))
    return _divergence_masked(old_log_prob, log_prob, advantages, response_mask, config, norm_length, inside)


@attrs.frozen
class PolicyLoss:
    """A registered policy loss (``actor.policy_loss``) and what it admits of the rest of the job.
    Calling it calls ``compute(old_log_prob, log_prob, advantages, response_mask, config, *,
    norm_length)``, which returns a ``PolicyLossOutput``."""

    compute: Callable[..., PolicyLossOutput]
    unbounded_lower_clip: bool = False  # a clip_ratio_low of 1 or more is meaningful (no lower bound)
    aggregation: str | None = None  # the loss_agg_mode it needs whatever the job's says (None: any)
    doc: str = ""

    def __call__(self, old_log_prob, log_prob, advantages, response_mask, config, *, norm_length=None):
        return self.compute(old_log_prob, log_prob, advantages, response_mask, config, norm_length=norm_length)


POLICY_LOSSES = {
    "vanilla": PolicyLoss(vanilla, doc="PPO clip, clip-higher and dual-clip"),
    "gspo": PolicyLoss(gspo, doc="sequence-level ratio (GSPO)"),
    "gpg": PolicyLoss(gpg, doc="-A log pi, no ratio (GPG)"),
    "clip_cov": PolicyLoss(clip_cov, doc="PPO with the highest-covariance tokens clipped"),
    "kl_cov": PolicyLoss(kl_cov, doc="PPO with a KL penalty on the highest-covariance tokens"),
    # clip_ratio_low >= 1 is meaningful here: no lower bound
    "cispo": PolicyLoss(cispo, unbounded_lower_clip=True, doc="clipped importance-sampling weights (CISPO)"),
    # losses verl aggregates per sequence whatever loss_agg_mode says: rlcore asks for seq-mean-token-mean
    "geo_mean": PolicyLoss(geo_mean, aggregation="seq-mean-token-mean", doc="geometric-mean ratio per sequence"),
    "sapo": PolicyLoss(sapo, aggregation="seq-mean-token-mean", doc="soft adaptive gating (SAPO)"),
    # DPPO's clip ranges are divergence thresholds: one of 1 or more is a loose region, not an error
    "dppo_tv": PolicyLoss(dppo_tv, unbounded_lower_clip=True, doc="divergence-masked PPO, total variation"),
    "dppo_kl": PolicyLoss(dppo_kl, unbounded_lower_clip=True, doc="divergence-masked PPO, binary KL"),
}


# --- the job's checks of actor.policy_loss (registered by rlcore.algorithms.plugin) -----------------


def policy_loss_problems(job) -> list[str]:
    """The clip range and aggregation the chosen policy loss admits."""
    actor, errors = job.config.actor, []
    losses = job.manager.registry("policy_losses")
    if actor.policy_loss not in losses:
        return errors  # reported by the names check
    loss = losses.get(actor.policy_loss)
    if not isinstance(loss, PolicyLoss):
        entry = losses.entry(actor.policy_loss)
        return [f"actor.policy_loss: policy loss {actor.policy_loss!r} registered by {entry.provider} is a "
                f"{type(loss).__name__}; expected an rlcore.api.PolicyLoss (its function and what it admits)"]
    low = actor.clip_ratio_low if actor.clip_ratio_low is not None else actor.clip_ratio
    if low >= 1.0 and not loss.unbounded_lower_clip:
        errors.append(f"actor.clip_ratio_low (or clip_ratio) must be < 1, got {low}")
    aggregation = loss.aggregation
    if aggregation is not None and actor.loss_agg_mode != aggregation:
        errors.append(f"actor.policy_loss = {actor.policy_loss!r} aggregates per sequence: set actor.loss_agg_mode "
                      f"= {aggregation!r} (got {actor.loss_agg_mode!r})")
    return errors
