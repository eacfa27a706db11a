import math

import pytest
import torch

from rlcore.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_controller,
    kl_loss,
)
from rlcore.config.schema import KlControl

LOG_PROB = [-1.0, -0.5, -2.0]
REF = [-1.2, -0.5, -1.0]


def by_hand(name):
    """Each estimator written out for one token; d = log p - log p_ref."""
    out = []
    for lp, ref in zip(LOG_PROB, REF):
        d = lp - ref
        out.append({"k1": d, "abs": abs(d), "k2": 0.5 * d * d, "k3": math.exp(-d) + d - 1}[name])
    return out


ALIASES = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_each_estimator_by_hand(name):
    kl = KL_ESTIMATORS[name](torch.tensor([LOG_PROB]), torch.tensor([REF]))
    assert kl[0].tolist() == pytest.approx(by_hand(ALIASES[name]), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_straight_through_has_the_value_of_its_base_and_the_gradient_of_k2(name):
    log_prob = torch.tensor([LOG_PROB], requires_grad=True)
    kl = KL_ESTIMATORS[name + "+"](log_prob, torch.tensor([REF]))
    assert kl[0].tolist() == pytest.approx(by_hand(ALIASES[name]), rel=1e-5, abs=1e-7)
    kl.sum().backward()
    assert log_prob.grad[0].tolist() == pytest.approx([lp - ref for lp, ref in zip(LOG_PROB, REF)], rel=1e-5)


def test_k3_is_clamped_as_verl():
    # d = log p - log p_ref = -30 or 30: the exponent is clamped to 20 and the result to 10
    kl = KL_ESTIMATORS["low_var_kl"](torch.tensor([0.0, -30.0]), torch.tensor([-30.0, 0.0]))
    assert kl.tolist() == [10.0, 10.0]
    assert KL_ESTIMATORS["k3"](torch.tensor([0.0]), torch.tensor([-5.0])).item() == pytest.approx(math.exp(-5) + 4)


def test_estimators_compute_in_fp32():
    kl = KL_ESTIMATORS["k3"](torch.tensor([-1.0], dtype=torch.bfloat16), torch.tensor([-1.5], dtype=torch.bfloat16))
    assert kl.dtype == torch.float32


def test_fixed_controller_never_moves():
    controller = kl_controller(KlControl())
    assert isinstance(controller, FixedKLController) and controller.value == 0.001
    controller.update(current_kl=5.0, n_steps=1000)
    assert controller.value == 0.001


@pytest.mark.parametrize(("current", "factor"), [(0.2, 1 + 0.2 * 100 / 10000), (0.0, 1 - 0.2 * 100 / 10000),
                                                 (0.11, 1 + 0.1 * 100 / 10000)])
def test_adaptive_controller_moves_toward_the_target(current, factor):
    controller = kl_controller(KlControl(type="adaptive", kl_coef=0.1, target_kl=0.1, horizon=10000))
    assert isinstance(controller, AdaptiveKLController)
    controller.update(current_kl=current, n_steps=100)
    assert controller.value == pytest.approx(0.1 * factor)


def test_kl_in_the_reward_by_hand():
    scores = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, 3.0], [-2.0, 9.0, 9.0]])
    ref = torch.tensor([[-1.5, -0.8, 0.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    controller = AdaptiveKLController(0.1, target=1.0, horizon=100)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, controller, KL_ESTIMATORS["kl"])
    # k1 on response tokens: (0.5, -0.2) and (-1.0); padding keeps its score
    assert rewards.tolist() == [pytest.approx([0.0 - 0.05, 1.0 + 0.02, 0.0]), pytest.approx([0.5 + 0.1, 0.0, 0.0])]
    current = ((0.5 - 0.2) / 2 + -1.0) / 2  # mean over samples of each sample's token mean
    assert metrics == {"actor/reward_kl_penalty": pytest.approx(current), "actor/reward_kl_penalty_coeff": 0.1}
    assert controller.value == pytest.approx(0.1 * (1 - 0.2 * 2 / 100))  # error clipped to -0.2, 2 samples


def test_kl_loss_aggregates_like_the_policy_loss():
    log_prob = torch.tensor([[-1.0, -0.5, 7.0]])
    ref = torch.tensor([[-1.2, -0.5, -9.0]])
    loss = kl_loss(log_prob, ref, torch.tensor([[1, 1, 0]]), KL_ESTIMATORS["k2"], "token-mean")
    assert loss.item() == pytest.approx((0.5 * 0.04 + 0.0) / 2)
