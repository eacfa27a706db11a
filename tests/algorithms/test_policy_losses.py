"""Policy losses against per-token Python loops and hand-sized cases."""

import math

import pytest
import torch

from rlcore.algorithms.aggregation import LOSS_AGG_MODES
from rlcore.algorithms.policy_losses import POLICY_LOSSES
from rlcore.config.schema import ActorConfig

METRICS = {"pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}

# One row per case of the clipped objective (clip 0.2, dual-clip c = 3), then padding.
#            log ratio          A     what happens
CASES = [(math.log(1.1), 1.0),  # inside the range: unclipped
         (math.log(1.5), 1.0),  # ratio above 1 + 0.2 with A > 0: clipped to 1.2
         (math.log(0.5), -2.0),  # ratio below 1 - 0.2 with A < 0: clipped to 0.8
         (math.log(0.5), 1.0),  # ratio below the range with A > 0: the unclipped term is larger
         (math.log(5.0), -1.0),  # ratio 5 with A < 0: dual clip caps the loss at 3 * |A|
         (math.log(1.25), 0.5)]  # above 1.2 but below 1.28: clipped only without clip-higher
OLD = torch.tensor([[-1.0, -2.0, -0.5, -1.5, -3.0, -0.7, 0.0, 0.0]])
LOG_RATIO = torch.tensor([[lr for lr, _ in CASES] + [25.0, -9.0]])  # padding holds wild values
ADV = torch.tensor([[a for _, a in CASES] + [4.0, -4.0]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])


def vanilla_loop(low, high, c=3.0):
    """Per-token PPO objective and clip flags, one token at a time."""
    losses, clipped, lower = [], [], []
    for log_ratio, a in CASES:
        ratio = math.exp(log_ratio)
        unclipped, clip = -a * ratio, -a * min(max(ratio, 1 - low), 1 + high)
        loss = max(unclipped, clip)
        clipped.append(clip > unclipped)
        lower.append(a < 0 and loss > -a * c)
        losses.append(min(loss, -a * c) if a < 0 else loss)
    return losses, clipped, lower


def run(name, log_prob=None, **config):
    log_prob = (OLD + LOG_RATIO if log_prob is None else log_prob).clone().requires_grad_()
    return POLICY_LOSSES[name](OLD, log_prob, ADV, MASK, ActorConfig(**config)), log_prob


@pytest.mark.parametrize(("config", "low", "high"), [({}, 0.2, 0.2), ({"clip_ratio_high": 0.28}, 0.2, 0.28),
                                                      ({"clip_ratio_low": 0.1, "clip_ratio": 0.3}, 0.1, 0.3)])
def test_vanilla_against_a_loop(config, low, high):
    out, _ = run("vanilla", **config)
    losses, clipped, lower = vanilla_loop(low, high)
    n = len(CASES)
    assert out.loss.item() == pytest.approx(sum(losses) / n, rel=1e-5)
    assert out.metrics["pg_loss"] == pytest.approx(sum(losses) / n, rel=1e-5)
    assert out.metrics["pg_clipfrac"] == pytest.approx(sum(clipped) / n)
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(sum(lower) / n)
    assert out.metrics["ppo_kl"] == pytest.approx(-sum(lr for lr, _ in CASES) / n, rel=1e-5)


def test_vanilla_by_hand():
    # the six cases by hand (clip 0.2, c 3): -1.1, -1.2, 1.6, -0.5, 3.0, -0.6
    out, _ = run("vanilla")
    assert out.loss.item() == pytest.approx((-1.1 - 1.2 + 1.6 - 0.5 + 3.0 - 0.6) / 6, rel=1e-5)
    assert out.metrics["pg_clipfrac"] == pytest.approx(3 / 6)  # cases 2, 3 and 6
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(1 / 6)  # case 5


def test_vanilla_gradient_flows_only_through_unclipped_response_tokens():
    out, log_prob = run("vanilla")
    out.loss.backward()
    grad = log_prob.grad[0].tolist()
    # d(-A r)/d log p = -A r, over 6 tokens; clipped and dual-clipped tokens and padding get none
    assert grad[0] == pytest.approx(-1.0 * 1.1 / 6, rel=1e-5)
    assert grad[3] == pytest.approx(-1.0 * 0.5 / 6, rel=1e-5)
    assert [grad[i] for i in (1, 2, 4, 5, 6, 7)] == [0.0] * 6


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_vanilla_aggregates_with_config_mode(mode):
    out, _ = run("vanilla", loss_agg_mode=mode)
    losses, _, _ = vanilla_loop(0.2, 0.2)
    width = MASK.shape[1]
    expected = {"token-mean": sum(losses) / 6, "seq-mean-token-sum": sum(losses),
                # one sequence: seq-mean-token-sum-norm is its token sum / (1 sequence x the width)
                "seq-mean-token-mean": sum(losses) / 6, "seq-mean-token-sum-norm": sum(losses) / width}[mode]
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)


def test_gspo_against_a_loop():
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -0.2, 0.0, 0.0]])
    log_ratio = torch.tensor([[0.3, 0.1, 0.2, 7.0], [-0.5, 0.1, 9.0, 9.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-0.5, -0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    log_prob = (old + log_ratio).requires_grad_()
    out = POLICY_LOSSES["gspo"](old, log_prob, adv, mask, ActorConfig(loss_agg_mode="seq-mean-token-mean"))
    expected, clipped, gradient = [], [], []
    for row, n in enumerate([3, 2]):
        a = adv[row, 0].item()
        s = math.exp(sum(log_ratio[row, :n].tolist()) / n)  # the geometric mean of the token ratios
        clip = min(max(s, 0.8), 1.2)
        expected.append(max(-a * s, -a * clip))
        clipped.append(n * [-a * clip > -a * s])
        # unclipped: each token's gradient is -A * s, then mean over the row, mean over rows
        gradient.append([0.0 if -a * clip > -a * s else -a * s / n / 2] * n)
    assert out.loss.item() == pytest.approx(sum(expected) / 2, rel=1e-5)  # seq 1: s = e^0.2 > 1.2, clipped
    assert out.metrics["pg_clipfrac"] == pytest.approx(sum(sum(c) for c in clipped) / 5)
    assert out.metrics["pg_clipfrac_lower"] == 0.0
    out.loss.backward()
    assert log_prob.grad[0, :3].tolist() == pytest.approx(gradient[0], abs=1e-7)
    assert log_prob.grad[1, :2].tolist() == pytest.approx(gradient[1], rel=1e-5)
    assert log_prob.grad[mask == 0].tolist() == [0.0] * 3


def test_gpg_is_minus_log_prob_times_advantage():
    out, log_prob = run("gpg")
    lp = (OLD + LOG_RATIO)[0, :6].tolist()
    assert out.loss.item() == pytest.approx(sum(-p * a for p, (_, a) in zip(lp, CASES)) / 6, rel=1e-5)
    out.loss.backward()
    assert log_prob.grad[0, :6].tolist() == pytest.approx([-a / 6 for _, a in CASES], rel=1e-5)
    assert out.metrics["pg_clipfrac"] == 0.0


# Clip-Cov / KL-Cov: one sequence of four tokens. Covariance of A = (2, 0, 0, -2) and
# log p = (-1, -3, -3, -3) (means 0 and -2.5) is (3, 0, 0, 1): only token 0 lies in (1, 5).
COV_LOG_PROB = torch.tensor([[-1.0, -3.0, -3.0, -3.0, 50.0]])
COV_ADV = torch.tensor([[2.0, 0.0, 0.0, -2.0, 9.0]])
COV_MASK = torch.tensor([[1, 1, 1, 1, 0]])


def cov_run(name, old, **config):
    log_prob = COV_LOG_PROB.clone().requires_grad_()
    return POLICY_LOSSES[name](old, log_prob, COV_ADV, COV_MASK, ActorConfig(**config)), log_prob


def test_clip_cov_drops_the_gradient_of_a_high_covariance_token():
    out, log_prob = cov_run("clip_cov", COV_LOG_PROB.clone(), clip_cov_ratio=0.25)
    # ratio 1 everywhere: per-token -A = (-2, 0, 0, 2); token 0 is removed -> (0 + 0 + 0 + 2) / 4
    assert out.loss.item() == pytest.approx(0.5)
    assert out.metrics["pg_clipfrac"] == pytest.approx(0.25)
    out.loss.backward()
    assert log_prob.grad[0].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.5, 0.0])


@pytest.mark.parametrize(("ratio", "dropped"), [(0.0002, 1), (0.0, 0)])
def test_clip_cov_count_is_at_least_one_unless_the_ratio_is_zero(ratio, dropped):
    out, _ = cov_run("clip_cov", COV_LOG_PROB.clone(), clip_cov_ratio=ratio)
    assert out.metrics["pg_clipfrac"] == pytest.approx(dropped / 4)


def test_kl_cov_penalises_the_top_covariance_token():
    old = COV_LOG_PROB + torch.tensor([[0.1, 0.0, 0.0, 0.0, 0.0]])  # token 0: log ratio -0.1
    out, log_prob = cov_run("kl_cov", old, kl_cov_ratio=0.25, ppo_kl_coef=0.1)
    token0 = -2.0 * math.exp(-0.1) + 0.1 * 0.1
    assert out.loss.item() == pytest.approx((token0 + 0.0 + 0.0 + 2.0) / 4, rel=1e-5)
    assert out.metrics["ppo_kl"] == pytest.approx(0.1 / 4, rel=1e-5)
    out.loss.backward()
    # d/dlog p of -A e^{lr} + coef |lr| at lr = -0.1: -A e^{-0.1} - coef
    assert log_prob.grad[0, 0].item() == pytest.approx((-2.0 * math.exp(-0.1) - 0.1) / 4, rel=1e-5)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_loss_has_one_calling_shape_fp32_and_the_metrics(name):
    log_prob = (OLD + LOG_RATIO).to(torch.bfloat16).requires_grad_()
    out = POLICY_LOSSES[name](OLD.to(torch.bfloat16), log_prob, ADV, MASK.bool(), ActorConfig(), norm_length=8)
    assert out.loss.dtype == torch.float32 and out.loss.dim() == 0
    # numbers, or 0-d tensors outside the graph that the update reads once a step (read_metrics)
    assert set(out.metrics) == METRICS and all(isinstance(v, float) or (v.dim() == 0 and not v.requires_grad)
                                               for v in out.metrics.values())
    out.loss.backward()
    assert (log_prob.grad[MASK == 0] == 0).all()


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_loss_survives_extreme_ratios_and_single_tokens(name):
    old = torch.tensor([[-100.0], [0.0]])
    log_prob = torch.tensor([[0.0], [-100.0]], requires_grad=True)
    out = POLICY_LOSSES[name](old, log_prob, torch.tensor([[1.0], [-1.0]]), torch.ones(2, 1), ActorConfig())
    out.loss.backward()
    assert math.isfinite(out.loss.item()) and torch.isfinite(log_prob.grad).all()
    assert all(math.isfinite(v) for v in out.metrics.values())


def test_cispo_weighs_each_tokens_log_prob_by_its_clipped_ratio_without_its_gradient():
    out, log_prob = run("cispo", clip_ratio_low=10.0, clip_ratio_high=0.2)
    # weights: ratios clipped to [1 - 10, 1.2]: 1.1, 1.2, 0.5, 0.5, 1.2, 1.2; loss -w * A * log p
    weights = [1.1, 1.2, 0.5, 0.5, 1.2, 1.2]
    new = (OLD + LOG_RATIO)[0, :6].tolist()
    expected = [-w * a * lp for w, (_, a), lp in zip(weights, CASES, new)]
    assert out.loss.item() == pytest.approx(sum(expected) / 6, rel=1e-5)
    assert out.metrics["pg_clipfrac"] == pytest.approx(3 / 6)  # cases 2, 5 and 6 clipped at 1.2
    out.loss.backward()
    grads = log_prob.grad[0, :6].tolist()
    assert grads == pytest.approx([-w * a / 6 for w, (_, a) in zip(weights, CASES)], rel=1e-5)


def test_geo_mean_is_minus_the_sequence_advantage_times_the_geometric_mean_of_clipped_ratios():
    old = torch.zeros(2, 3)
    log_ratio = torch.tensor([[0.1, 0.6, -0.6], [0.3, -0.1, 9.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = POLICY_LOSSES["geo_mean"](old, log_ratio, adv, mask, ActorConfig(clip_ratio=0.4,
                                                                            loss_agg_mode="seq-mean-token-mean"))
    # row 1 (A > 0): 0.6 clipped to 0.4, -0.6 kept (the smaller); row 2 (A < 0): 0.3 and -0.1 kept
    first = -1.0 * math.exp((0.1 + 0.4 - 0.6) / 3)
    second = 2.0 * math.exp((0.3 - 0.1) / 2)
    assert out.loss.item() == pytest.approx((first + second) / 2, rel=1e-5)
    assert out.metrics["pg_clipfrac"] == pytest.approx(2 / 5)  # 0.6 and -0.6 of the positive row
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(0.0)


def test_sapo_gates_the_ratio_smoothly_with_the_advantages_temperature():
    out, log_prob = run("sapo", tau_pos=1.0, tau_neg=2.0)
    expected = []
    for lr, a in CASES:
        tau = 1.0 if a > 0 else 2.0
        expected.append(-a * 4.0 / tau / (1.0 + math.exp(-tau * (math.exp(lr) - 1.0))))
    assert out.loss.item() == pytest.approx(sum(expected) / 6, rel=1e-5)
    # at ratio 1 the gate's slope is 1: the plain policy gradient, -A per token
    at_one, log_prob = run("sapo", log_prob=OLD.clone())
    at_one.loss.backward()
    assert log_prob.grad[0, :6].tolist() == pytest.approx([-a / 6 for _, a in CASES], rel=1e-5)


def test_sequence_losses_ask_for_sequence_aggregation_and_cispo_may_leave_the_lower_clip_open():
    from rlcore.config import load_job
    from rlcore.errors import ConfigError
    from rlcore.plugins.manager import PluginManager

    def problems(*overrides):
        try:
            load_job(None, list(overrides), manager=PluginManager(), check=True)
        except ConfigError as exc:
            return exc.problems
        return []

    assert problems("actor.policy_loss=cispo", "actor.clip_ratio_low=10") == []
    assert problems("actor.policy_loss=vanilla", "actor.clip_ratio_low=10") == [
        "actor.clip_ratio_low (or clip_ratio) must be < 1, got 10.0"]
    assert problems("actor.policy_loss=sapo") == ["actor.policy_loss = 'sapo' aggregates per sequence: set "
                                                  "actor.loss_agg_mode = 'seq-mean-token-mean' (got 'token-mean')"]
    assert problems("actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean") == []  # verl's spelling sets it


# DPPO's five cases: (old probability, new probability, advantage), trust region 0.15, truncation c = 3
DPPO_CASES = [(0.5, 0.6, 1.0),  # p rose by 0.1 with A > 0: inside, ratio 1.2
              (0.5, 0.8, 1.0),  # rose by 0.3 with A > 0: outside (TV and KL)
              (0.5, 0.2, -1.0),  # fell by 0.3 with A < 0: outside (TV and KL)
              (0.5, 0.4, -1.0),  # fell by 0.1 with A < 0: inside, ratio 0.8
              (0.1, 0.4, -1.0),  # rose with A < 0: inside, ratio 4 truncated to c = 3
              (0.9, 0.99, 1.0)]  # rose by 0.09 with A > 0: inside for TV, outside for KL (0.144 > 0.05)


def dppo_inputs():
    old = torch.tensor([[math.log(p_old) for p_old, _, _ in DPPO_CASES]])
    new = torch.tensor([[math.log(p) for _, p, _ in DPPO_CASES]], requires_grad=True)
    return old, new, torch.tensor([[a for _, _, a in DPPO_CASES]]), torch.ones(1, len(DPPO_CASES))


def binary_kl(p_old, p):
    return p_old * math.log(p_old / p) + (1 - p_old) * math.log((1 - p_old) / (1 - p))


@pytest.mark.parametrize(("name", "inside"), [("dppo_tv", [True, False, False, True, True, True]),
                                              ("dppo_kl", [True, False, False, True, True, False])])
def test_dppo_masks_tokens_outside_the_divergence_region_and_truncates_the_ratio(name, inside):
    # the regions by hand: TV compares p - p_old with +-0.15; binary KL of 0.5 -> 0.6 is 0.020 (inside
    # 0.05), of 0.5 -> 0.8 and 0.5 -> 0.2 is 0.223 and of 0.9 -> 0.99 is 0.144 (outside); a move against
    # the advantage's sign is always inside
    threshold = 0.15 if name == "dppo_tv" else 0.05
    for (p_old, p, a), kept in zip(DPPO_CASES, inside):
        moved_for_gain = (p > p_old) if a > 0 else (p < p_old)
        by_tv = abs(p - p_old) <= threshold or not moved_for_gain
        by_kl = binary_kl(p_old, p) <= threshold or not moved_for_gain
        assert kept == (by_tv if name == "dppo_tv" else by_kl)
    old, new, adv, mask = dppo_inputs()
    out = POLICY_LOSSES[name](old, new, adv, mask, ActorConfig(clip_ratio=threshold, clip_ratio_c=3.0))
    weights = [min(p / p_old, 3.0) for p_old, p, _ in DPPO_CASES]
    expected = [-a * w * math.log(p) if kept else 0.0 for (_, p, a), w, kept in zip(DPPO_CASES, weights, inside)]
    n = len(DPPO_CASES)
    assert out.loss.item() == pytest.approx(sum(expected) / n, rel=1e-5)
    assert out.metrics["pg_clipfrac"] == pytest.approx(inside.count(False) / n)
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(1 / n)  # case 5's ratio 4 > 3
    ratios = [math.log(p_old / p) for p_old, p, _ in DPPO_CASES]
    assert out.metrics["ppo_kl"] == pytest.approx(sum(ratios) / n, rel=1e-5)
    out.loss.backward()
    # the gradient of a kept token is -A * its truncated ratio (no gradient through the ratio); a
    # descent step raises the log-prob of a token with A > 0, lowers one with A < 0, leaves the rest
    grads = new.grad[0].tolist()
    assert grads == pytest.approx([-a * w / n if kept else 0.0
                                   for (_, _, a), w, kept in zip(DPPO_CASES, weights, inside)], rel=1e-5)
    stepped = new.detach() - new.grad
    for (_, _, a), kept, before, after in zip(DPPO_CASES, inside, new[0].tolist(), stepped[0].tolist()):
        assert (after > before if a > 0 else after < before) if kept else after == before


def test_dppo_keeps_the_gradient_a_ppo_clip_would_cut():
    # case 5, A < 0 with ratio 4: vanilla's dual clip caps the loss at c * |A| (no gradient), DPPO-TV
    # still lowers the token's probability with weight c
    old, new, adv, mask = dppo_inputs()
    for name, expected in (("vanilla", 0.0), ("dppo_tv", 3.0 / len(DPPO_CASES))):
        log_prob = new.detach().clone().requires_grad_()
        POLICY_LOSSES[name](old, log_prob, adv, mask, ActorConfig(clip_ratio=0.15)).loss.backward()
        assert log_prob.grad[0, 4].item() == pytest.approx(expected, abs=1e-7)


def test_dppo_thresholds_may_reach_one_and_verls_dppo_script_keys_load():
    from rlcore.config import load_job
    from rlcore.plugins.manager import PluginManager

    job = load_job(None, ["actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl",
                          "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
                          "actor_rollout_ref.actor.clip_ratio_low=1.5", "actor_rollout_ref.actor.clip_ratio_high=0.05",
                          "actor_rollout_ref.actor.clip_ratio_c=10000.0"], manager=PluginManager(), check=True)
    actor = job.config.actor
    assert (actor.policy_loss, actor.clip_ratio_low, actor.clip_ratio_c) == ("dppo_kl", 1.5, 10000.0)
