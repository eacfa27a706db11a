"""Advantage estimators: ``compute(AdvantageInputs, AlgorithmConfig) -> AdvantageOutputs``.

Each is registered by name (``algorithm.adv_estimator``) as an ``AdvantageEstimator`` that also says
which roles it needs, so the trainer starts only those and rejects a job that cannot work. Formulas
follow verl's ``core_algos.py``. Outcome estimators read each sample's score as the sum of its
``token_level_rewards`` over the response and, as verl, return the advantages as the returns too.

A row without response tokens is padding: it gets advantage 0 and is left out of group statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import torch
from torch import Tensor

from rlcore.algorithms.groups import group_stats, group_sum
from rlcore.algorithms.masked import as_mask, masked_whiten

if TYPE_CHECKING:
    from rlcore.algorithms.config import AlgorithmConfig

GRPO_EPS = 1e-6  # keeps a group of identical scores at advantage 0 instead of 0/0


@attrs.frozen
class AdvantageInputs:
    """What an estimator may read. Tensors are on one device; ``B`` samples, ``T`` response tokens."""

    token_level_rewards: Tensor  # (B, T) score at the last response token, minus any in-reward KL
    response_mask: Tensor  # (B, T) 1 on response tokens, 0 on padding
    group_ids: Tensor  # (B,) int64; samples of the same prompt share an id
    values: Tensor | None = None  # (B, T) critic values, for estimators that need a critic
    baseline_scores: Tensor | None = None  # (B,) score of the greedy baseline rollout (remax)
    # (B, K) the reward function's per-component scores, one column per algorithm.gdpo_reward_keys (gdpo)
    reward_components: Tensor | None = None
    old_log_probs: Tensor | None = None  # (B, T) the actor's log-probs of the sampled tokens
    # (B, T) sum over the vocabulary of pi^2 at each response position, from the actor's log-prob pass
    # (actor.calculate_sum_pi_squared), for optimal_token_baseline
    sum_pi_squared: Tensor | None = None
    rollout_is_weights: Tensor | None = None  # (B, T) rollout importance weights, where they are applied


@attrs.frozen
class AdvantageOutputs:
    advantages: Tensor  # (B, T) fp32, 0 on padding
    returns: Tensor  # (B, T) fp32, the critic's targets where there is one


@attrs.frozen
class AdvantageEstimator:
    """A registered estimator and what it needs from the rest of the job."""

    compute: Callable[[AdvantageInputs, AlgorithmConfig], AdvantageOutputs]
    needs_critic: bool = False  # start a critic and pass ``values``
    needs_groups: bool = False  # compares the n samples of a prompt: rollout.n must be >= 2
    needs_baseline_rollout: bool = False  # generate one greedy response per prompt: ``baseline_scores``
    needs_reward_components: bool = False  # the reward's per-component scores: ``reward_components``
    needs_sum_pi_squared: bool = False  # ``old_log_probs`` and ``sum_pi_squared`` (actor.calculate_sum_pi_squared)
    doc: str = ""
    paper: str = ""


def _outcome(batch: AdvantageInputs) -> tuple[Tensor, Tensor, Tensor]:
    """(mask (B, T) bool, score per sample (B,), has-response-tokens (B,) bool)."""
    mask = as_mask(batch.response_mask)
    scores = torch.where(mask, batch.token_level_rewards.float(), 0.0).sum(-1)
    return mask, scores, mask.any(-1)


def _per_token(advantage: Tensor, mask: Tensor) -> AdvantageOutputs:
    """Broadcast a per-sample advantage (B,) over the response; as verl, returns = advantages."""
    advantages = torch.where(mask, advantage.unsqueeze(-1), 0.0)
    return AdvantageOutputs(advantages, advantages)


@torch.no_grad()
def compute_gae(batch: AdvantageInputs, config: AlgorithmConfig) -> AdvantageOutputs:
    if batch.values is None:
        raise ValueError("gae needs the critic's values (AdvantageInputs.values)")
    mask = as_mask(batch.response_mask)
    rewards = torch.where(mask, batch.token_level_rewards.float(), 0.0)
    values = torch.where(mask, batch.values.float(), 0.0)
    gamma, lam = config.gamma, config.lam
    next_value = torch.zeros_like(rewards[:, 0])
    running = torch.zeros_like(rewards[:, 0])
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        # Padding (and any masked token inside a response) passes the running terms through
        # untouched, so a padded sample computes exactly what the unpadded one does.
        running = torch.where(mask[:, t], delta + gamma * lam * running, running)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        advantages[:, t] = running
    returns = torch.where(mask, advantages + values, 0.0)
    return AdvantageOutputs(masked_whiten(advantages, mask), returns)


def _group_normalized(scores: Tensor, group_ids: Tensor, valid: Tensor, by_std: bool) -> Tensor:
    """(B,) each score minus its group's mean, divided by the group's std (``by_std``)."""
    stats = group_stats(scores, group_ids, valid)
    alone = stats.count <= 1  # verl: a group of one keeps its raw score
    advantage = scores - torch.where(alone, 0.0, stats.mean)
    if by_std:
        advantage = advantage / (torch.where(alone, 1.0, stats.std) + GRPO_EPS)
    return advantage


@torch.no_grad()
def compute_grpo(batch: AdvantageInputs, config: AlgorithmConfig) -> AdvantageOutputs:
    mask, scores, valid = _outcome(batch)
    return _per_token(_group_normalized(scores, batch.group_ids, valid, config.norm_adv_by_std_in_grpo), mask)


@torch.no_grad()
def compute_gdpo(batch: AdvantageInputs, config: AlgorithmConfig) -> AdvantageOutputs:
    """Each reward component normalised within its group on its own (GRPO's normalisation), the
    results summed with ``gdpo_reward_weights``, then whitened over the batch's tokens. The summed
    score (``token_level_rewards``) is not read: a component that varies little is not drowned by one
    that varies a lot."""
    if batch.reward_components is None:
        raise ValueError("gdpo needs the reward's per-component scores (AdvantageInputs.reward_components)")
    mask, _, valid = _outcome(batch)
    components = batch.reward_components.float()  # (B, K)
    weights = config.gdpo_reward_weights or (1.0,) * components.shape[1]
    summed = sum(weight * _group_normalized(components[:, k], batch.group_ids, valid, config.norm_adv_by_std_in_grpo)
                 for k, weight in enumerate(weights))
    advantages = masked_whiten(summed.unsqueeze(-1).expand_as(mask), mask)
    return AdvantageOutputs(advantages, advantages)


@torch.no_grad()
def compute_rloo(batch: AdvantageInputs, config: AlgorithmConfig) -> AdvantageOutputs:
    mask, scores, valid = _outcome(batch)
    stats = group_stats(scores, batch.group_ids, valid)
    n = stats.count
    # score minus the mean of the other n - 1 samples, written as verl writes it
    leave_one_out = (scores - stats.mean) * n / (n - 1.0).clamp(min=1.0)
    return _per_token(torch.where(n > 1, leave_one_out, scores), mask)


@torch.no_grad()
def compute_opo(batch: AdvantageInputs, config: AlgorithmConfig) -> AdvantageOutputs:
    mask, scores, valid = _outcome(batch)
    lengths = mask.float().sum(-1)  # (B,)
    weights = torch.where(valid, lengths, 0.0)
    # the length-weighted group mean is the optimal baseline of OPO
    baseline = group_sum(weights * scores, batch.group_ids) / group_sum(weights, batch.group_ids).clamp(min=1.0)
    alone = group_sum(valid.float(), batch.group_ids) <= 1
    return _per_token(scores - torch.where(alone, 0.0, baseline), mask)


@torch.no_grad()
def compute_gpg(batch: AdvantageInputs, config: AlgorithmConfig) -> AdvantageOutputs:
    mask, scores, valid = _outcome(batch)
    stats = group_stats(scores, batch.group_ids, valid)
    # alpha = B / M rescales the batch for the M samples that carry a (nonzero) signal
    alpha = valid.sum() / (valid & (scores != 0)).sum().clamp(min=1)
    advantage = alpha * (scores - torch.where(stats.count <= 1, 0.0, stats.mean))
    return _per_token(advantage, mask)


@torch.no_grad()
def compute_reinforce_plus_plus_baseline(batch: AdvantageInputs, config: AlgorithmConfig) -> AdvantageOutputs:
    mask, scores, valid = _outcome(batch)
    stats = group_stats(scores, batch.group_ids, valid)
    advantage = scores - torch.where(stats.count <= 1, 0.0, stats.mean)
    advantages = masked_whiten(advantage.unsqueeze(-1).expand_as(mask), mask)  # whitened over the batch
    return AdvantageOutputs(advantages, advantages)


@torch.no_grad()
def compute_reinforce_plus_plus(batch: AdvantageInputs, config: AlgorithmConfig) -> AdvantageOutputs:
    mask = as_mask(batch.response_mask)
    rewards = torch.where(mask, batch.token_level_rewards.float(), 0.0)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        # A masked token inside a response (say a tool's output) passes the return through to the
        # tokens before it; verl restarts it there. Trailing padding is the same either way.
        running = torch.where(mask[:, t], rewards[:, t] + config.gamma * running, running)
        returns[:, t] = running
    returns = torch.where(mask, returns, 0.0)
    return AdvantageOutputs(masked_whiten(returns, mask), returns)


@torch.no_grad()
def compute_remax(batch: AdvantageInputs, config: AlgorithmConfig) -> AdvantageOutputs:
    if batch.baseline_scores is None:
        raise ValueError("remax needs the greedy baseline's scores (AdvantageInputs.baseline_scores)")
    mask = as_mask(batch.response_mask)
    rewards = torch.where(mask, batch.token_level_rewards.float(), 0.0)
    returns = rewards.flip(-1).cumsum(-1).flip(-1)  # reward-to-go
    advantages = torch.where(mask, returns - batch.baseline_scores.float().unsqueeze(-1), 0.0)
    return AdvantageOutputs(advantages, torch.where(mask, returns, 0.0))


OTB_EPS = 1e-8  # verl's: a position no sample of the group reaches gets baseline 0, not 0/0


@torch.no_grad()
def compute_optimal_token_baseline(batch: AdvantageInputs, config: AlgorithmConfig) -> AdvantageOutputs:
    """Reward-to-go G_t minus a baseline per position t of each group: B_t = sum_i G_it W_it / sum_i W_it,
    with W_t = sum_{j<=t} (1 - 2 pi_j + sum_v pi_v^2) the path-variance proxy of the tokens so far
    (scaled by the squared rollout importance weight where there is one); a group of one keeps its
    returns; the longest response of a group, where it is the only one that long, gets baseline 0
    past the second longest (verl's handle_zero_tail)."""
    if batch.old_log_probs is None or batch.sum_pi_squared is None:
        raise ValueError("optimal_token_baseline needs the actor's log-probs and sum of squared probabilities "
                         "(AdvantageInputs.old_log_probs, sum_pi_squared: actor.calculate_sum_pi_squared)")
    mask = as_mask(batch.response_mask)
    rewards = torch.where(mask, batch.token_level_rewards.float(), 0.0)
    returns = rewards.flip(-1).cumsum(-1).flip(-1)  # (B, T) reward-to-go
    per_token = 1.0 - 2.0 * batch.old_log_probs.float().exp() + batch.sum_pi_squared.float()  # (B, T)
    if batch.rollout_is_weights is not None:
        per_token = per_token * batch.rollout_is_weights.float().square()
    path = torch.where(mask, per_token, 0.0).cumsum(-1)  # (B, T) W_t
    weighted = torch.where(mask, path, 0.0)
    baseline = group_sum(returns * weighted, batch.group_ids) / (group_sum(weighted, batch.group_ids) + OTB_EPS)
    lengths = mask.sum(-1)  # (B,)
    members = group_sum(mask.any(-1).float(), batch.group_ids)
    baseline = torch.where((members > 1)[:, None], baseline, 0.0)
    for group in batch.group_ids.unique():
        rows = (batch.group_ids == group).nonzero().squeeze(-1)
        if len(rows) < 2:
            continue
        longest, second = lengths[rows].topk(2).values.tolist()
        if longest > second:  # one response alone past the others: no baseline there
            baseline[rows[lengths[rows].argmax()], second:] = 0.0
    return AdvantageOutputs(torch.where(mask, returns - baseline, 0.0), torch.where(mask, returns, 0.0))


GAE = AdvantageEstimator(
    compute_gae, needs_critic=True,
    doc="PPO: generalized advantage estimation with a critic (gamma, lam), whitened over the batch",
    paper="https://arxiv.org/abs/1506.02438")
GRPO = AdvantageEstimator(
    compute_grpo, needs_groups=True,
    doc="score minus the group mean, divided by the group std unless norm_adv_by_std_in_grpo = false",
    paper="https://arxiv.org/abs/2402.03300")
RLOO = AdvantageEstimator(
    compute_rloo, needs_groups=True,
    doc="score minus the mean of the other samples of the group (leave-one-out)",
    paper="https://arxiv.org/abs/2402.14740")
REINFORCE_PLUS_PLUS = AdvantageEstimator(
    compute_reinforce_plus_plus,
    doc="discounted return-to-go (gamma), whitened over the batch",
    paper="https://arxiv.org/abs/2501.03262")
REINFORCE_PLUS_PLUS_BASELINE = AdvantageEstimator(
    compute_reinforce_plus_plus_baseline, needs_groups=True,
    doc="score minus the group mean, whitened over the batch",
    paper="https://arxiv.org/abs/2501.03262")
OPO = AdvantageEstimator(
    compute_opo, needs_groups=True,
    doc="score minus the length-weighted group mean (optimal baseline)",
    paper="https://arxiv.org/abs/2505.23585")
GPG = AdvantageEstimator(
    compute_gpg, needs_groups=True,
    doc="score minus the group mean, scaled by batch size / samples with a nonzero score",
    paper="https://arxiv.org/abs/2504.02546")
GDPO = AdvantageEstimator(
    compute_gdpo, needs_groups=True, needs_reward_components=True,
    doc="each reward component (algorithm.gdpo_reward_keys) normalised within its group, weighted, summed, "
        "whitened over the batch",
    paper="https://arxiv.org/abs/2601.05242")
OPTIMAL_TOKEN_BASELINE = AdvantageEstimator(
    compute_optimal_token_baseline, needs_groups=True, needs_sum_pi_squared=True,
    doc="reward-to-go minus a baseline per position of the group, weighted by each path's variance proxy "
        "1 - 2 pi + sum pi^2 so far (needs actor.calculate_sum_pi_squared)",
    paper="https://arxiv.org/abs/2602.07078")
REMAX = AdvantageEstimator(
    compute_remax, needs_baseline_rollout=True,
    doc="reward-to-go minus the score of a greedy response to the same prompt",
    paper="https://arxiv.org/abs/2310.10505")

ESTIMATORS = {
    "gae": GAE,
    "grpo": GRPO,
    "rloo": RLOO,
    "reinforce_plus_plus": REINFORCE_PLUS_PLUS,
    "reinforce_plus_plus_baseline": REINFORCE_PLUS_PLUS_BASELINE,
    "opo": OPO,
    "gpg": GPG,
    "remax": REMAX,
    "gdpo": GDPO,
    "optimal_token_baseline": OPTIMAL_TOKEN_BASELINE,
}


# --- the job's checks of algorithm.adv_estimator (registered by rlcore.algorithms.plugin) -------------


def _estimator(job) -> AdvantageEstimator | None:
    registry = job.manager.registry("advantage_estimators")
    name = job.config.algorithm.adv_estimator
    return registry.get(name) if name in registry else None  # an unknown name is reported by the names check


def estimator_problems(job) -> list[str]:
    """What the chosen estimator needs of the rest of the job (reward components, sum pi^2)."""
    estimator, algorithm, errors = _estimator(job), job.config.algorithm, []
    if estimator is None:
        return errors
    name = algorithm.adv_estimator
    if estimator.needs_reward_components and not algorithm.gdpo_reward_keys:
        errors.append(f"algorithm.adv_estimator = {name!r} normalises each reward component on its own: set "
                      "algorithm.gdpo_reward_keys to the keys of the reward function's returned dict that hold them")
    weights = algorithm.gdpo_reward_weights
    if weights is not None and len(weights) != len(algorithm.gdpo_reward_keys):
        errors.append(f"algorithm.gdpo_reward_weights has {len(weights)} weight(s) for "
                      f"{len(algorithm.gdpo_reward_keys)} key(s) of algorithm.gdpo_reward_keys: give one per key")
    if estimator.needs_sum_pi_squared and not job.config.actor.calculate_sum_pi_squared:
        errors.append(f"algorithm.adv_estimator = {name!r} weighs each position by 1 - 2 pi + sum pi^2 from the "
                      "actor's log-prob pass: set actor.calculate_sum_pi_squared = true")
    if job.config.actor.calculate_sum_pi_squared and algorithm.rollout_bypass:
        errors.append("actor.calculate_sum_pi_squared comes from the old log-prob pass, which bypass mode "
                      "(algorithm.rollout_bypass) skips: leave one of them off")
    return errors


def estimator_unused(job) -> list[str]:
    """Settings the chosen estimator does not read: groups of one, reward components, the critic's."""
    estimator, config, warnings = _estimator(job), job.config, []
    if estimator is None:
        return warnings
    name = config.algorithm.adv_estimator
    distilling_only = config.distillation.enable and not config.distillation.use_task_rewards
    if estimator.needs_groups and config.rollout.n < 2 and not distilling_only:
        warnings.append(f"algorithm.adv_estimator = {name!r} compares samples within a group, but rollout.n = "
                        f"{config.rollout.n}: each sample is a group of its own, whose advantage is its raw score "
                        "(no baseline), as in verl; set rollout.n >= 2 for a group baseline")
    if not estimator.needs_reward_components:
        for key in job.given("algorithm.gdpo_reward_keys") + job.given("algorithm.gdpo_reward_weights"):
            warnings.append(f"{key} has no effect: algorithm.adv_estimator = {name!r} reads the summed score")
    if not estimator.needs_critic:
        for key in job.given("critic"):
            if key not in job.tables:
                warnings.append(f"{key} has no effect: algorithm.adv_estimator = {name!r} runs without a critic")
        if config.algorithm.use_pf_ppo:
            warnings.append(f"algorithm.use_pf_ppo has no effect: PF-PPO resamples the batch after a critic's "
                            f"advantages (adv_estimator = 'gae'), as in verl, and algorithm.adv_estimator = {name!r}")
    if not config.algorithm.use_pf_ppo:
        warnings += [f"{key} has no effect while algorithm.use_pf_ppo is false" for key in job.given("algorithm.pf_ppo")]
    return warnings
