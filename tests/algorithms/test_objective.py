import attrs
import torch

from rlcore.algorithms.kl import KL_ESTIMATORS
from rlcore.algorithms.objective import actor_loss
from rlcore.algorithms.policy_losses import vanilla
from rlcore.config.schema import ActorConfig


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
