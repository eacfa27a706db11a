import attrs
import torch

from rlcore.algorithms.kl import KL_ESTIMATORS
from rlcore.algorithms.objective import actor_loss, micro_batch_actor_loss
from rlcore.algorithms.policy_losses import vanilla
from rlcore.config.schema import ActorConfig, JobConfig


def test_the_objective_adds_entropy_bonus_and_kl_loss_to_the_policy_loss():
    torch.manual_seed(0)
    log_prob, old, ref, adv = (torch.randn(2, 3) for _ in range(4))
    entropy = torch.rand(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    config = attrs.evolve(ActorConfig(), entropy_coeff=0.01, kl_loss_coef=0.1)
    loss, metrics = actor_loss(log_prob, entropy, old, adv, mask, config, vanilla,
                               kl_estimator=KL_ESTIMATORS["k1"], ref_log_prob=ref)
    keep = mask.bool()
    policy = vanilla(old, log_prob, adv, mask, config).loss
    entropy_mean = entropy[keep].mean()  # token-mean, worked out here
    kl_mean = (log_prob - ref)[keep].mean()
    assert torch.allclose(loss, policy - 0.01 * entropy_mean + 0.1 * kl_mean)
    assert metrics["entropy"] == float(entropy_mean) and abs(metrics["kl_loss"] - float(kl_mean)) < 1e-6
    without, _ = actor_loss(log_prob, entropy, old, adv, mask, config, vanilla, entropy_grad=False)
    assert torch.allclose(without, policy)


def test_a_micro_batch_loss_reads_its_columns_and_normalises_by_the_configured_response_length():
    torch.manual_seed(1)
    columns = {key: torch.randn(2, 4) for key in ("old_log_probs", "advantages", "ref_log_prob")}
    columns["response_mask"] = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    log_prob, entropy = torch.randn(2, 4), torch.rand(2, 4)
    job = JobConfig()
    job = attrs.evolve(job, actor=attrs.evolve(job.actor, loss_agg_mode="seq-mean-token-sum-norm", kl_loss_coef=0.2),
                       data=attrs.evolve(job.data, max_response_length=4))
    fetched = []

    def fetch(*keys):
        fetched.extend(keys)
        return [columns[key] for key in keys]

    loss, metrics = micro_batch_actor_loss(log_prob, entropy, fetch, job, vanilla, KL_ESTIMATORS["low_var_kl"])
    expected, _ = actor_loss(log_prob, entropy, columns["old_log_probs"], columns["advantages"],
                             columns["response_mask"], job.actor, vanilla, kl_estimator=KL_ESTIMATORS["low_var_kl"],
                             ref_log_prob=columns["ref_log_prob"], norm_length=4)
    assert torch.equal(loss, expected) and "kl_loss" in metrics
    fetched.clear()
    micro_batch_actor_loss(log_prob, entropy, fetch, job, vanilla)
    assert "ref_log_prob" not in fetched  # without a KL loss the reference column is not needed
