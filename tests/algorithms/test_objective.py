"""The actor's whole objective, checked against per-token loops written here from the formulas
(PPO clip with dual clip, the KL estimators, the aggregation modes), not against the functions the
objective itself calls."""

import math

import attrs
import pytest
import torch

from rlcore.algorithms.kl import KL_ESTIMATORS
from rlcore.algorithms.objective import actor_loss, micro_batch_actor_loss
from rlcore.algorithms.policy_losses import vanilla
from rlcore.config.schema import ActorConfig, JobConfig
from rlcore.training.specs import ActorAlgorithms, actor_spec


def ppo_token_loss(log_prob: float, old: float, advantage: float, clip: float = 0.2, clip_c: float = 3.0) -> float:
    """PPO's pessimistic clipped loss of one token, capped at -A * clip_c when A < 0 (dual clip)."""
    ratio = math.exp(log_prob - old)
    loss = max(-advantage * ratio, -advantage * min(max(ratio, 1.0 - clip), 1.0 + clip))
    return min(loss, -advantage * clip_c) if advantage < 0 else loss


def k3(log_prob: float, ref: float) -> float:
    """Schulman's low-variance KL estimator, exp(ref - lp) - (ref - lp) - 1, capped at 10 as verl's."""
    d = ref - log_prob
    return min(math.exp(d) - d - 1.0, 10.0)


def tokens(mask: torch.Tensor) -> list[tuple[int, int]]:
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]


def test_the_objective_adds_entropy_bonus_and_kl_loss_to_the_policy_loss():
    torch.manual_seed(0)
    log_prob, old, ref, adv = (torch.randn(2, 3, dtype=torch.float64) for _ in range(4))
    entropy = torch.rand(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    config = attrs.evolve(ActorConfig(), entropy_coeff=0.01, kl_loss_coef=0.1)
    loss, metrics = actor_loss(log_prob, entropy, old, adv, mask, config, vanilla,
                               kl_estimator=KL_ESTIMATORS["k1"], ref_log_prob=ref)
    kept = tokens(mask)  # token-mean: every response token of the batch weighs the same
    policy = sum(ppo_token_loss(log_prob[i, t].item(), old[i, t].item(), adv[i, t].item()) for i, t in kept) / 5
    entropy_mean = sum(entropy[i, t].item() for i, t in kept) / 5
    kl_mean = sum(log_prob[i, t].item() - ref[i, t].item() for i, t in kept) / 5
    assert loss.item() == pytest.approx(policy - 0.01 * entropy_mean + 0.1 * kl_mean, rel=1e-5)
    assert metrics["entropy"] == pytest.approx(entropy_mean, rel=1e-6)
    assert metrics["kl_loss"] == pytest.approx(kl_mean, rel=1e-5)
    assert metrics["pg_loss"] == pytest.approx(policy, rel=1e-5)
    without, _ = actor_loss(log_prob, entropy, old, adv, mask, config, vanilla, entropy_grad=False)
    assert without.item() == pytest.approx(policy, rel=1e-5)


def test_a_micro_batch_loss_reads_its_columns_and_normalises_by_the_configured_response_length():
    """Responses are padded to the batch's longest (width 4), the normaliser is
    data.max_response_length (6): the two differ, so the test sees which one is used."""
    torch.manual_seed(1)
    columns = {key: torch.randn(2, 4) for key in ("old_log_probs", "advantages", "ref_log_prob")}
    columns["response_mask"] = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    log_prob, entropy = torch.randn(2, 4), torch.rand(2, 4)
    job = JobConfig()
    job = attrs.evolve(job, actor=attrs.evolve(job.actor, loss_agg_mode="seq-mean-token-sum-norm", kl_loss_coef=0.2),
                       data=attrs.evolve(job.data, max_response_length=6))
    fetched = []

    def fetch(*keys):
        fetched.extend(keys)
        return [columns[key] for key in keys]

    loss, metrics = micro_batch_actor_loss(log_prob, entropy, fetch,
                                           actor_spec(job, ActorAlgorithms(vanilla, KL_ESTIMATORS["low_var_kl"])))
    kept = tokens(columns["response_mask"])  # seq-mean-token-sum-norm: the token sum / (2 sequences x 6)
    old, adv, ref = columns["old_log_probs"], columns["advantages"], columns["ref_log_prob"]
    policy = sum(ppo_token_loss(log_prob[i, t].item(), old[i, t].item(), adv[i, t].item()) for i, t in kept) / (2 * 6)
    kl = sum(k3(log_prob[i, t].item(), ref[i, t].item()) for i, t in kept) / (2 * 6)  # one token hits the cap
    # entropy_coeff is 0: no entropy term
    assert loss.item() == pytest.approx(policy + 0.2 * kl, rel=1e-5)
    assert metrics["kl_loss"] == pytest.approx(kl, rel=1e-5)
    fetched.clear()
    micro_batch_actor_loss(log_prob, entropy, fetch, actor_spec(job, ActorAlgorithms(vanilla, None)))
    assert "ref_log_prob" not in fetched  # without a KL loss the reference column is not needed
