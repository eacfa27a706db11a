"""Invariants over generated batches (hypothesis): group sums, padding, clip-higher."""

import attrs
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcore.algorithms.advantages import ESTIMATORS, AdvantageInputs
from rlcore.algorithms.aggregation import LOSS_AGG_MODES, agg_loss
from rlcore.algorithms.kl import KL_ESTIMATORS, FixedKLController, apply_kl_penalty
from rlcore.algorithms.policy_losses import POLICY_LOSSES
from rlcore.algorithms.value import explained_variance, value_loss
from rlcore.config.schema import ActorConfig, AlgorithmConfig

SETTINGS = settings(max_examples=60, deadline=None)
floats = st.floats(-3.0, 3.0, allow_nan=False, width=32)
scores = st.one_of(st.sampled_from([0.0, 1.0]), floats)  # many ties, so all-equal groups occur


@attrs.frozen
class Batch:
    group_ids: list[int]
    lengths: list[int]
    width: int
    scores: list[float]
    tokens: dict[str, list[list[float]]]  # name -> (B, T) values: values, old/new/ref log-probs, advantages


@st.composite
def batches(draw, min_group=1):
    groups = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(min_group, 4), min_size=groups, max_size=groups))
    group_ids = [g * 10 + 3 for g, size in enumerate(sizes) for _ in range(size)]
    group_ids = draw(st.permutations(group_ids))  # groups need not be contiguous
    width = draw(st.integers(1, 5))
    n = len(group_ids)
    lengths = draw(st.lists(st.integers(1, width), min_size=n, max_size=n))
    grid = st.lists(st.lists(floats, min_size=width, max_size=width), min_size=n, max_size=n)
    tokens = {name: draw(grid) for name in ("values", "old", "delta", "ref", "advantages", "vpreds", "returns")}
    return Batch(group_ids, lengths, width, draw(st.lists(scores, min_size=n, max_size=n)), tokens)


def tensors(batch: Batch, extra_columns: int = 0, extra_rows: int = 0, garbage: float = 0.0):
    """The batch as tensors, padded with ``extra_columns`` and all-padding ``extra_rows`` of garbage."""
    n, width = len(batch.lengths), batch.width + extra_columns
    rows = n + extra_rows
    mask = torch.zeros(rows, width, dtype=torch.bool)
    for i, length in enumerate(batch.lengths):
        mask[i, :length] = True

    def grid(values, offset=0.0):
        out = torch.full((rows, width), garbage)
        out[:n, :batch.width] = torch.tensor(values) + offset
        return torch.where(mask, out, garbage)

    rewards = torch.where(mask, 0.0, garbage)
    for i, length in enumerate(batch.lengths):
        rewards[i, length - 1] = batch.scores[i]
    old = grid(batch.tokens["old"], offset=-3.0)  # log-probs in [-6, 0]
    return {
        "mask": mask,
        "group_ids": torch.tensor(batch.group_ids + [batch.group_ids[0]] * extra_rows),
        "rewards": rewards,
        "values": grid(batch.tokens["values"]),
        "baseline": torch.tensor(batch.scores + [garbage] * extra_rows) * 0.5,
        "old": old,
        "new": torch.where(mask, old + grid(batch.tokens["delta"]) / 6, garbage),
        "ref": grid(batch.tokens["ref"], offset=-3.0),
        "advantages": grid(batch.tokens["advantages"]),
        "vpreds": grid(batch.tokens["vpreds"]),
        "returns": grid(batch.tokens["returns"]),
    }


def estimate(name, t, **config):
    scores = torch.where(t["mask"], t["rewards"], 0.0).sum(-1)
    inputs = AdvantageInputs(t["rewards"], t["mask"], t["group_ids"], t["values"], t["baseline"],
                             reward_components=torch.stack([scores, scores.square()], dim=1), old_log_probs=t["old"],
                             sum_pi_squared=torch.where(t["mask"], t["old"].exp().square() + 0.1, t["old"]))
    return ESTIMATORS[name].compute(inputs, AlgorithmConfig(**config))


def close(a, b):
    return torch.allclose(a, b, atol=1e-4, rtol=1e-4)


@SETTINGS
@given(batches(min_group=2), st.sampled_from(["grpo", "grpo-unnormalised", "rloo", "gpg"]))
def test_group_relative_advantages_sum_to_zero_within_each_group(batch, name):
    t = tensors(batch)
    config = {"norm_adv_by_std_in_grpo": False} if name == "grpo-unnormalised" else {}
    advantages = estimate(name.split("-")[0], t, **config).advantages[:, 0]  # (B,) one value per sample
    for group in set(batch.group_ids):
        members = advantages[t["group_ids"] == group]
        assert abs(members.sum().item()) <= 1e-4 * max(1.0, members.abs().max().item())


padding = st.tuples(st.integers(0, 3), st.integers(0, 2), st.sampled_from([0.0, 7.5, -1e4]))


@SETTINGS
@given(batches(), padding)
def test_padding_leaves_every_advantage_unchanged(batch, pad):
    plain, padded = tensors(batch), tensors(batch, *pad)
    n, width = len(batch.lengths), batch.width
    for name in ESTIMATORS:
        a, b = estimate(name, plain), estimate(name, padded)
        assert close(a.advantages, b.advantages[:n, :width]), name
        assert close(a.returns, b.returns[:n, :width]), name
        assert (b.advantages[~padded["mask"]] == 0).all(), name


@SETTINGS
@given(batches(), padding, st.sampled_from(LOSS_AGG_MODES))
def test_padding_leaves_every_loss_and_metric_unchanged(batch, pad, mode):
    plain, padded = tensors(batch), tensors(batch, *pad)
    config = ActorConfig(loss_agg_mode=mode, clip_cov_ratio=0.3, kl_cov_ratio=0.3, clip_cov_lb=-1.0)
    for name, loss in POLICY_LOSSES.items():
        outputs = []
        for t in (plain, padded):
            torch.manual_seed(0)  # clip_cov picks its tokens at random
            outputs.append(loss(t["old"], t["new"], t["advantages"], t["mask"], config, norm_length=batch.width))
        a, b = outputs
        assert close(a.loss, b.loss), name
        assert a.metrics.keys() == b.metrics.keys()
        assert all(abs(a.metrics[k] - b.metrics[k]) <= 1e-4 * max(1.0, abs(a.metrics[k])) for k in a.metrics), name
    a, b = (agg_loss(t["values"], t["mask"], mode, norm_length=batch.width) for t in (plain, padded))
    assert close(a, b)
    a, b = (value_loss(t["vpreds"], t["returns"], t["values"], t["mask"], 0.5, mode, norm_length=batch.width)
            for t in (plain, padded))
    assert close(a.loss, b.loss) and abs(a.metrics["vf_clipfrac"] - b.metrics["vf_clipfrac"]) < 1e-6
    a, b = (explained_variance(t["values"], t["returns"], t["mask"]) for t in (plain, padded))
    assert abs(a - b) <= 1e-4 * max(1.0, abs(a))


@SETTINGS
@given(batches(), padding, st.sampled_from(sorted(KL_ESTIMATORS)))
def test_padding_leaves_kl_in_the_reward_unchanged(batch, pad, name):
    plain, padded = tensors(batch), tensors(batch, *pad)
    n, width = len(batch.lengths), batch.width
    a_ctrl, b_ctrl = FixedKLController(0.05), FixedKLController(0.05)
    a, a_metrics = apply_kl_penalty(plain["rewards"], plain["old"], plain["ref"], plain["mask"], a_ctrl,
                                    KL_ESTIMATORS[name])
    b, b_metrics = apply_kl_penalty(padded["rewards"], padded["old"], padded["ref"], padded["mask"], b_ctrl,
                                    KL_ESTIMATORS[name])
    assert close(torch.where(plain["mask"], a, 0.0), torch.where(padded["mask"], b, 0.0)[:n, :width])
    assert abs(a_metrics["actor/reward_kl_penalty"] - b_metrics["actor/reward_kl_penalty"]) < 1e-4


@SETTINGS
@given(batches(), st.floats(0.0, 0.9), st.floats(0.05, 0.9), st.sampled_from(LOSS_AGG_MODES))
def test_clip_higher_with_low_equal_to_high_is_vanilla(batch, eps, other, mode):
    t = tensors(batch)
    results = []
    for config in (ActorConfig(clip_ratio=eps, loss_agg_mode=mode),
                   ActorConfig(clip_ratio=other, clip_ratio_low=eps, clip_ratio_high=eps, loss_agg_mode=mode)):
        log_prob = t["new"].clone().requires_grad_()
        out = POLICY_LOSSES["vanilla"](t["old"], log_prob, t["advantages"], t["mask"], config)
        out.loss.backward()
        results.append((out, log_prob.grad))
    (a, grad_a), (b, grad_b) = results
    assert torch.equal(a.loss, b.loss) and a.metrics == b.metrics and torch.equal(grad_a, grad_b)
