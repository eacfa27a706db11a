"""rlcore's registered algorithms against verl 0.9.1's own code (``verl/trainer/ppo/core_algos.py``
and ``verl/utils/torch_functional.py``, the PyPI wheel installed without its dependencies): every
advantage estimator, policy loss, aggregation mode, KL estimator, the value loss and the entropy that
both register, on the same random fp32 inputs with edge cases, to 1e-5 relative (1e-6 absolute for
entries that are 0). Each deviation that docs/algorithms.md lists ("Where rlcore differs from verl")
is asserted as such, so that none drifts silently. Nothing of verl is stubbed: its modules are
imported whole (``tests/verl_reference.py``). Outside CI a missing verl skips this module, saying
why; under ``.ci/run`` (``RLCORE_CI=1``) it fails."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from rlcore.algorithms.advantages import ESTIMATORS, AdvantageInputs
from rlcore.algorithms.aggregation import LOSS_AGG_MODES, agg_loss
from rlcore.algorithms.entropy import entropy_from_logits
from rlcore.algorithms.kl import KL_ESTIMATORS
from rlcore.algorithms.policy_losses import POLICY_LOSSES
from rlcore.algorithms.value import value_loss
from rlcore.batch import Batch
from rlcore.config.schema import ActorConfig, AlgorithmConfig
from tests.verl_reference import import_verl

verl = import_verl()
core_algos, verl_F = verl.core_algos, verl.torch_functional
VerlActorConfig, PolicyLossConfig = verl.ActorConfig, verl.PolicyLossConfig

RTOL, ATOL = 1e-5, 1e-6


def close(actual, expected, what=""):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32),
                               torch.as_tensor(expected, dtype=torch.float32), rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


# -- inputs ----------------------------------------------------------------------------------------
WIDTH = 40
# rows per group: a group of one, a group whose members all score the same, groups of 2 and 5
GROUP_SIZES = (1, 3, 2, 5)


def group_ids() -> torch.Tensor:
    return torch.cat([torch.full((n,), g) for g, n in enumerate(GROUP_SIZES)])  # (B,)


def lengths(rows: int, generator: torch.Generator) -> torch.Tensor:
    """Response lengths (B,): very short (1) and very long (the whole width) rows among random ones."""
    values = torch.randint(2, WIDTH, (rows,), generator=generator)
    values[0], values[1], values[-1] = 1, WIDTH, WIDTH
    values[4] = 1
    return values


def left_mask(row_lengths: torch.Tensor, width: int = WIDTH) -> torch.Tensor:
    return (torch.arange(width)[None, :] < row_lengths[:, None]).float()  # (B, T)


def outcome_rewards(mask: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Each score at its row's last response token (B, T)."""
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(len(mask)), mask.sum(-1).long() - 1] = scores
    return rewards


def outcome_batch(seed: int):
    generator = torch.Generator().manual_seed(seed)
    ids = group_ids()
    mask = left_mask(lengths(len(ids), generator))
    scores = torch.rand(len(ids), generator=generator) * 2 - 0.5
    scores[ids == 1] = 0.5  # equal scores in a group
    scores[(ids == 3).nonzero()[0]] = 0.0  # a zero score (gpg counts the nonzero ones)
    return ids, mask, scores, generator


def rlcore_advantages(name, ids, mask, rewards, config=None, **inputs):
    out = ESTIMATORS[name].compute(AdvantageInputs(token_level_rewards=rewards, response_mask=mask, group_ids=ids,
                                                   **inputs), config or AlgorithmConfig())
    return out.advantages, out.returns


def on_mask(tensor, mask):
    return tensor[mask.bool()]


# -- advantage estimators --------------------------------------------------------------------------
GROUP_ESTIMATORS = {  # rlcore name -> verl's functions of the same name (and its vectorised twin)
    "grpo": ("grpo", "grpo_vectorized"),
    # not rloo_vectorized: verl's two disagree on a group of one (rloo keeps its score, the twin gives 0)
    "rloo": ("rloo",),
    "reinforce_plus_plus_baseline": ("reinforce_plus_plus_baseline",),
    "opo": ("opo",),
    "gpg": ("gpg",),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("name", "by_std"), [(name, True) for name in sorted(GROUP_ESTIMATORS)] + [("grpo", False)])
def test_group_estimators_equal_verls(name, seed, by_std):
    ids, mask, scores, _ = outcome_batch(seed)
    rewards = outcome_rewards(mask, scores)
    ours, _ = rlcore_advantages(name, ids, mask, rewards, AlgorithmConfig(norm_adv_by_std_in_grpo=by_std))
    for verl_name in GROUP_ESTIMATORS[name]:
        kwargs = {"norm_adv_by_std_in_grpo": by_std} if name == "grpo" else {}
        theirs, _ = core_algos.get_adv_estimator_fn(verl_name)(
            token_level_rewards=rewards.clone(), response_mask=mask, index=ids.numpy(), config=None, **kwargs)
        close(on_mask(ours, mask), on_mask(theirs, mask), verl_name)
        assert (ours[mask == 0] == 0).all()
    if name == "grpo":  # the edge cases are what they should be
        assert torch.allclose(ours[ids == 1], torch.zeros(())), "equal scores: advantage 0"
        assert torch.allclose(on_mask(ours[:1], mask[:1]), scores[0]), "a group of one keeps its score"


@pytest.mark.parametrize("seed", [0, 1])
def test_gae_equals_verls(seed):
    generator = torch.Generator().manual_seed(seed)
    mask = left_mask(lengths(11, generator))
    rewards = torch.randn(11, WIDTH, generator=generator) * mask
    values = torch.randn(11, WIDTH, generator=generator)
    config = AlgorithmConfig(gamma=0.97, lam=0.9)
    ours, our_returns = rlcore_advantages("gae", group_ids(), mask, rewards, config, values=values)
    theirs, their_returns = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma=0.97, lam=0.9)
    close(on_mask(ours, mask), on_mask(theirs, mask), "advantages")
    close(on_mask(our_returns, mask), on_mask(their_returns, mask), "returns")


@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_plus_plus_and_remax_equal_verls(seed):
    generator = torch.Generator().manual_seed(seed)
    ids = group_ids()
    mask = left_mask(lengths(len(ids), generator))
    rewards = torch.randn(len(ids), WIDTH, generator=generator) * mask  # dense rewards: discounting shows
    config = AlgorithmConfig(gamma=0.9)
    ours, our_returns = rlcore_advantages("reinforce_plus_plus", ids, mask, rewards, config)
    theirs, their_returns = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=config)
    close(on_mask(ours, mask), on_mask(theirs, mask), "reinforce_plus_plus advantages")
    close(on_mask(our_returns, mask), on_mask(their_returns, mask), "reinforce_plus_plus returns")
    baselines = torch.randn(len(ids), generator=generator)
    ours, our_returns = rlcore_advantages("remax", ids, mask, rewards, baseline_scores=baselines)
    theirs, their_returns = core_algos.compute_remax_outcome_advantage(rewards, baselines, mask)
    close(on_mask(ours, mask), on_mask(theirs, mask), "remax advantages")
    close(on_mask(our_returns, mask), on_mask(their_returns, mask), "remax returns")


@pytest.mark.parametrize("seed", [0, 1])
def test_gdpo_equals_verls(seed):
    """Two reward components, weighted; verl reads them from the batch's non-tensor columns."""
    ids, mask, scores, generator = outcome_batch(seed)
    components = torch.stack([scores, (torch.rand(len(ids), generator=generator) > 0.5).float()], dim=1)  # (B, 2)
    components[ids == 1] = components[ids == 1][0]  # a group equal in every component
    config = AlgorithmConfig(adv_estimator="gdpo", gdpo_reward_keys=("accuracy", "format"),
                             gdpo_reward_weights=(1.0, 0.5))
    ours, _ = rlcore_advantages("gdpo", ids, mask, outcome_rewards(mask, components.sum(-1)), config,
                                reward_components=components)
    prompt = torch.ones(len(ids), 3)
    theirs, _ = core_algos.compute_gdpo_outcome_advantage(
        token_level_rewards=outcome_rewards(mask, components.sum(-1)), response_mask=mask, index=ids.numpy(),
        config={"gdpo_reward_keys": ["accuracy", "format"], "gdpo_reward_weights": [1.0, 0.5]},
        non_tensor_batch={"accuracy": components[:, 0].numpy(), "format": components[:, 1].numpy()},
        batch={"prompts": prompt, "attention_mask": torch.cat([prompt, mask], dim=1).long()})
    close(on_mask(ours, mask), on_mask(theirs, mask))


@pytest.mark.parametrize("with_is_weights", [False, True])
def test_optimal_token_baseline_equals_verls(with_is_weights):
    ids, mask, scores, generator = outcome_batch(3)
    rewards = outcome_rewards(mask, scores)
    old_log_probs = -torch.rand(len(ids), WIDTH, generator=generator) * 3
    sum_pi_squared = torch.rand(len(ids), WIDTH, generator=generator) * 0.5
    weights = torch.rand(len(ids), WIDTH, generator=generator) + 0.5 if with_is_weights else None
    ours, our_returns = rlcore_advantages("optimal_token_baseline", ids, mask, rewards, old_log_probs=old_log_probs,
                                          sum_pi_squared=sum_pi_squared, rollout_is_weights=weights)
    theirs, their_returns = core_algos.compute_optimal_token_baseline_advantage(
        rewards, mask, ids.numpy(), old_log_probs, sum_pi_squared, rollout_is_weights=weights)
    close(on_mask(ours, mask), on_mask(theirs, mask), "advantages")
    close(on_mask(our_returns, mask), on_mask(their_returns, mask), "returns")


def test_every_shared_estimator_is_compared():
    compared = set(GROUP_ESTIMATORS) | {"gae", "reinforce_plus_plus", "remax", "gdpo", "optimal_token_baseline"}
    verl_names = set(core_algos.ADV_ESTIMATOR_REGISTRY)
    assert set(ESTIMATORS) & verl_names == compared


def test_deviation_rows_without_response_tokens_are_padding_not_group_members():
    """docs/algorithms.md: rlcore leaves a row without response tokens out of its group's statistics
    (padding, advantage 0); verl counts it as a member scoring 0. Without it the two agree."""
    ids, mask, scores, _ = outcome_batch(0)
    empty = len(ids) - 2  # a member of the group of 5
    padded_mask = mask.clone()
    padded_mask[empty] = 0
    rewards = outcome_rewards(mask, scores) * padded_mask
    ours, _ = rlcore_advantages("grpo", ids, padded_mask, rewards)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(rewards, padded_mask, ids.numpy())
    keep = torch.arange(len(ids)) != empty
    without, _ = core_algos.compute_grpo_outcome_advantage(rewards[keep], padded_mask[keep], ids[keep].numpy())
    assert (ours[empty] == 0).all() and (theirs[empty] == 0).all()
    close(on_mask(ours[keep], padded_mask[keep]), on_mask(without, padded_mask[keep]), "rlcore = verl without the row")
    group = (ids == ids[empty]) & keep
    assert not torch.allclose(on_mask(ours[group], padded_mask[group]), on_mask(theirs[group], padded_mask[group]))


# -- policy losses ---------------------------------------------------------------------------------
SHARED_LOSSES = sorted(set(POLICY_LOSSES) & set(core_algos.POLICY_LOSS_REGISTRY))
# losses that verl aggregates per sequence whatever loss_agg_mode says (rlcore requires that mode)
PER_SEQUENCE = {"geo_mean", "sapo"}
# extreme log-ratios: beyond verl's +-20 clamp, with log-probs that stay <= 0
EXTREME = [(-40.0, -5.0), (-2.0, -50.0), (-30.0, -1.0), (-1.0, -25.0)]


def loss_inputs(seed: int, rows: int = 9):
    generator = torch.Generator().manual_seed(seed)
    mask = left_mask(lengths(rows, generator))
    old = -torch.rand(rows, WIDTH, generator=generator) * 3
    new = (old + torch.randn(rows, WIDTH, generator=generator) * 0.3).clamp(max=0.0)
    for k, (old_lp, new_lp) in enumerate(EXTREME):  # in row 1, which is as long as the width
        old[1, 3 * k], new[1, 3 * k] = old_lp, new_lp
    advantages = torch.randn(rows, 1, generator=generator).expand(rows, WIDTH).clone()  # one per sequence
    advantages[2] = 0.0  # a zero advantage (the sign is 0 in geo_mean)
    return old, new, advantages, mask


def configs(name: str, mode: str):
    """The same settings for rlcore and verl; clip_cov and kl_cov pick a sizable share of tokens."""
    settings = dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode)
    if name.startswith("dppo"):
        settings.update(clip_ratio_low=0.15, clip_ratio_high=0.1)
    cov = dict(clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=5.0, kl_cov_ratio=0.1, ppo_kl_coef=0.7)
    ours = ActorConfig(policy_loss=name, tau_pos=1.0, tau_neg=1.05, **settings, **cov)
    theirs = VerlActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1, tau_pos=1.0, tau_neg=1.05,
                             policy_loss=PolicyLossConfig(loss_mode=name, **cov), **settings)
    return ours, theirs


def run_both(name, mode, old, new, advantages, mask, norm_length=None):
    ours_config, verl_config = configs(name, mode)
    ours_lp, verl_lp = new.clone().requires_grad_(), new.clone().requires_grad_()
    torch.manual_seed(7)  # clip_cov draws its tokens with torch.randperm: the same draw for both
    ours = POLICY_LOSSES[name](old, ours_lp, advantages, mask, ours_config, norm_length=norm_length)
    if norm_length is not None:
        verl_config.global_batch_info["loss_scale_factor"] = norm_length
    torch.manual_seed(7)
    verl_loss, verl_metrics = core_algos.get_policy_loss_fn(name)(
        old_log_prob=old, log_prob=verl_lp, advantages=advantages, response_mask=mask.bool(), loss_agg_mode=mode,
        config=verl_config)
    ours.loss.backward()
    verl_loss.backward()
    return ours, ours_lp.grad, verl_loss, verl_lp.grad, verl_metrics


def loss_cases():
    for name in SHARED_LOSSES:
        for mode in (["seq-mean-token-mean"] if name in PER_SEQUENCE else LOSS_AGG_MODES):
            yield name, mode


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("name", "mode"), list(loss_cases()))
def test_policy_losses_equal_verls_in_value_gradient_and_metrics(name, mode, seed):
    old, new, advantages, mask = loss_inputs(seed)
    ours, our_grad, verl_loss, verl_grad, verl_metrics = run_both(name, mode, old, new, advantages, mask,
                                                                  norm_length=64 if seed else None)
    assert torch.isfinite(verl_loss) and torch.isfinite(verl_grad).all(), "the inputs keep verl finite"
    close(ours.loss, verl_loss, "loss")
    close(our_grad * mask, verl_grad * mask, "gradient")
    assert (our_grad[mask == 0] == 0).all()
    for key, value in verl_metrics.items():  # rlcore reports at least every metric verl reports
        close(ours.metrics[key.removeprefix("actor/")], value, key)


def test_kl_cov_gradient_at_a_log_ratio_beyond_20_is_verls_not_0():
    """The clamp at +-20 once zeroed kl_cov's gradient there; verl's is -A * ratio, huge."""
    old = torch.tensor([[-30.0, -1.0]])
    new = torch.tensor([[-1.0, -1.2]])
    ours, our_grad, verl_loss, verl_grad, _ = run_both("kl_cov", "token-mean", old, new, torch.ones(1, 2),
                                                       torch.ones(1, 2))
    assert verl_grad[0, 0].abs() > 1e10
    close(our_grad, verl_grad)


def test_saturating_exp_changes_nothing_where_verls_loss_is_finite_and_stays_finite_past_it():
    """clip_cov reads exp(log-ratio) unclamped, as verl: at a log-ratio of 88 (exp finite) both agree;
    at 100 with A > 0 verl's loss is still finite (the clipped branch) and rlcore's is the same, while
    verl's gradient is NaN (0 * inf through exp) and rlcore's is 0."""
    for log_ratio, finite_grad in ((88.0, True), (100.0, False)):
        old = torch.tensor([[-log_ratio - 1.0, -1.0]])
        new = torch.tensor([[-1.0, -1.0]])
        ours, our_grad, verl_loss, verl_grad, _ = run_both("clip_cov", "token-mean", old, new, torch.ones(1, 2),
                                                           torch.ones(1, 2))
        close(ours.loss, verl_loss, f"loss at {log_ratio}")
        if finite_grad:
            close(our_grad, verl_grad, f"gradient at {log_ratio}")
        else:
            assert torch.isnan(verl_grad[0, 0]) and our_grad[0, 0] == 0.0


def test_deviation_metrics_rlcore_reports_where_verl_reports_none():
    """docs/algorithms.md: every rlcore loss reports pg_clipfrac, pg_clipfrac_lower and ppo_kl; verl's
    gpg reports none, clip_cov no pg_clipfrac_lower, kl_cov only ppo_kl."""
    old, new, advantages, mask = loss_inputs(0)
    missing = {}
    for name in SHARED_LOSSES:
        ours, _, _, _, verl_metrics = run_both(name, "token-mean", old, new, advantages, mask)
        assert set(ours.metrics) == {"pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}
        missing[name] = {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"} - {k.removeprefix("actor/") for k in verl_metrics}
    assert {k: v for k, v in missing.items() if v} == {
        "gpg": {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}, "clip_cov": {"pg_clipfrac_lower"},
        "kl_cov": {"pg_clipfrac", "pg_clipfrac_lower"}}


def test_deviation_geo_mean_over_micro_batches_is_the_mini_batch_mean():
    """docs/algorithms.md: verl's geo_mean loss is torch.mean over the micro-batch's rows whatever
    the global batch, so its micro-batch losses add up to the micro-batch count times the mean;
    rlcore (seq-mean-token-mean, weighted by sequences) keeps the mini-batch mean. They agree on one
    micro-batch."""
    old, new, advantages, mask = loss_inputs(0, rows=8)
    whole, _, verl_whole, _, _ = run_both("geo_mean", "seq-mean-token-mean", old, new, advantages, mask)
    halves = [run_both("geo_mean", "seq-mean-token-mean", old[s], new[s], advantages[s], mask[s])
              for s in (slice(0, 4), slice(4, 8))]
    close(sum(0.5 * h[0].loss for h in halves), whole.loss, "rlcore: two micro-batches of 4 weighted 1/2")
    close(whole.loss, verl_whole, "one micro-batch")
    close(sum(h[2] for h in halves), 2 * verl_whole, "verl: the sum of two micro-batch means")


# -- aggregation over micro-batches and ranks ------------------------------------------------------
class ThreadAllReduce:
    """``all_reduce(SUM)`` between threads standing for ranks: each passes its value, all get the sum."""

    def __init__(self, world: int):
        self.world, self.values, self.lock = world, [], threading.Lock()
        self.barrier = threading.Barrier(world)

    def __call__(self, value, *_):
        with self.lock:
            self.values.append(value)
        self.barrier.wait()
        total = sum(self.values)
        self.barrier.wait()
        return total


def on_ranks(world: int, work) -> list:
    """``work(rank)`` on ``world`` threads at once; their results in rank order."""
    results, errors = [None] * world, []

    def run(rank):
        try:
            results[rank] = work(rank)
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return results


# each rank's micro-batches, as row counts: uneven, and rank 1 runs a filler (0 rows, weighted 0)
RANK_MICROS = ((1, 3, 2), (4, 0, 2))
NORM_LENGTH = 48  # data.max_response_length: wider than the tensors, so it is not the width


def micro_slices(sizes):
    start = 0
    for size in sizes:
        yield slice(start, start + size)
        start += size


def verl_mini_batch(mode, loss_mat, mask):
    """verl's engine: every micro-batch's agg_loss with the global token and sequence counts and
    dp_size; its backward adds the micro-batches of a rank and DDP/FSDP averages the ranks."""
    world = len(RANK_MICROS)
    shares = torch.split(torch.arange(len(mask)), [sum(s) for s in RANK_MICROS])
    total = 0.0
    for rank, rows in enumerate(shares):
        for part in micro_slices(RANK_MICROS[rank]):
            if part.stop == part.start:
                continue  # verl runs no filler
            picked = rows[part]
            total = total + core_algos.agg_loss(
                loss_mat[picked], mask[picked], mode, dp_size=world, batch_num_tokens=int(mask.sum()),
                global_batch_size=len(mask), loss_scale_factor=NORM_LENGTH)
    return total / world


def rlcore_mini_batch(mode, loss_mat, mask, backend, monkeypatch):
    """rlcore's backend: each micro-batch's agg_loss times ``micro_weights`` (the real function, its
    all-reduce between threads standing for the ranks), summed per rank, averaged over ranks."""
    world = len(RANK_MICROS)
    shares = torch.split(torch.arange(len(mask)), [sum(s) for s in RANK_MICROS])
    all_reduce = ThreadAllReduce(world)
    if backend == "fsdp":
        import rlcore_fsdp.batching as batching

        monkeypatch.setattr(batching, "world_size", lambda: world)
        monkeypatch.setattr(batching, "_global_sum", all_reduce)
    else:
        import rlcore_megatron.compute as compute

        monkeypatch.setattr(compute, "data_parallel_sum", all_reduce)

    def micro_parts(rank):
        rows = shares[rank]
        return [rows[part] for part in micro_slices(RANK_MICROS[rank])]

    def weights(rank):
        parts = micro_parts(rank)
        if backend == "fsdp":  # a filler holds one row (its loss weighted 0), as batching.micro_batches makes it
            micros = [batching.MicroBatch(Batch({"response_mask": mask[p if len(p) else shares[rank][:1]]}), p)
                      for p in parts]
            return batching.micro_weights(micros, mode)
        micros = [compute.Micro(None, None, None, {"response_mask": mask[p]}, p) for p in parts]
        return compute.micro_weights(micros, mode, world, torch.device("cpu"))

    rank_weights = on_ranks(world, weights)
    total = 0.0
    for rank in range(world):
        for part, weight in zip(micro_parts(rank), rank_weights[rank]):
            if len(part):
                total = total + weight * agg_loss(loss_mat[part], mask[part], mode, norm_length=NORM_LENGTH)
            else:
                assert weight == 0.0, "a filler weighs 0"
    return total / world


@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregation_over_micro_batches_and_two_ranks_equals_verls(mode, backend, monkeypatch):
    generator = torch.Generator().manual_seed(5)
    rows = sum(map(sum, RANK_MICROS))
    mask = left_mask(lengths(rows, generator), 30)
    losses = torch.randn(rows, 30, generator=generator)
    ours_mat, verl_mat = losses.clone().requires_grad_(), losses.clone().requires_grad_()
    ours = rlcore_mini_batch(mode, ours_mat, mask, backend, monkeypatch)
    theirs = verl_mini_batch(mode, verl_mat, mask)
    ours.backward()
    theirs.backward()
    close(ours, theirs, "mini-batch loss")
    close(ours_mat.grad, verl_mat.grad, "gradient")
    # and both are the whole mini-batch's loss in one call
    close(theirs, core_algos.agg_loss(losses, mask, mode, loss_scale_factor=NORM_LENGTH), "verl, one call")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_equals_verls_in_one_call(mode):
    generator = torch.Generator().manual_seed(6)
    mask = left_mask(lengths(7, generator))
    mask[3] = 0  # a row without tokens: both leave it out of the sequence count in one call
    losses = torch.randn(7, WIDTH, generator=generator)
    close(agg_loss(losses, mask, mode), core_algos.agg_loss(losses, mask, mode), "default length")
    close(agg_loss(losses, mask, mode, norm_length=100),
          core_algos.agg_loss(losses, mask, mode, loss_scale_factor=100), "given length")


def test_sum_norm_by_hand_is_verls():
    """verl 0.9.1: sum_i sum_t L_it / (sequences x length); two sequences of sums 3 and 4, length 3."""
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    expected = (3.0 + 4.0) / (2 * 3)
    assert core_algos.agg_loss(losses, mask, "seq-mean-token-sum-norm").item() == pytest.approx(expected)
    assert agg_loss(losses, mask, "seq-mean-token-sum-norm").item() == pytest.approx(expected)


def test_deviation_sum_norm_length_is_max_response_length_not_the_micro_batchs_longest():
    """docs/algorithms.md: verl's engine, with loss_scale_factor unset, divides by the width of each
    micro-batch padded to its own longest response; rlcore divides by data.max_response_length, which
    is verl with loss_scale_factor = data.max_response_length."""
    generator = torch.Generator().manual_seed(8)
    mask = left_mask(torch.tensor([3, 7, 5]), 7)  # a micro-batch padded to its longest response, 7
    losses = torch.randn(3, 7, generator=generator)
    ours = agg_loss(losses, mask, "seq-mean-token-sum-norm", norm_length=NORM_LENGTH)
    close(ours, core_algos.agg_loss(losses, mask, "seq-mean-token-sum-norm", loss_scale_factor=NORM_LENGTH))
    verl_default = core_algos.agg_loss(losses, mask, "seq-mean-token-sum-norm")
    close(ours * NORM_LENGTH / 7, verl_default, "verl's default divides by the micro-batch's width")


# -- KL, value loss, entropy -----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_kl_estimators_equal_verls_in_value_and_gradient(name):
    generator = torch.Generator().manual_seed(9)
    ref = -torch.rand(6, 12, generator=generator) * 3
    log_prob = ref + torch.randn(6, 12, generator=generator)
    log_prob[0, :4] = torch.tensor([ref[0, 0] + 30, ref[0, 1] - 30, ref[0, 2] + 9, ref[0, 3] - 12])  # past the clamps
    ours_lp, verl_lp = log_prob.clone().requires_grad_(), log_prob.clone().requires_grad_()
    ours = KL_ESTIMATORS[name](ours_lp, ref)
    theirs = core_algos.kl_penalty(verl_lp, ref, name)
    close(ours, theirs, "value")
    weights = torch.randn(6, 12, generator=generator)
    (ours * weights).sum().backward()
    (theirs * weights).sum().backward()
    close(ours_lp.grad, verl_lp.grad, "gradient")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_equals_verls(mode):
    generator = torch.Generator().manual_seed(10)
    mask = left_mask(lengths(7, generator))
    values, returns = torch.randn(7, WIDTH, generator=generator), torch.randn(7, WIDTH, generator=generator)
    vpreds = values + torch.randn(7, WIDTH, generator=generator) * 0.5
    ours_v, verl_v = vpreds.clone().requires_grad_(), vpreds.clone().requires_grad_()
    ours = value_loss(ours_v, returns, values, mask, 0.2, mode, norm_length=64)
    theirs, clipfrac = core_algos.compute_value_loss(verl_v, returns, values, mask.bool(), 0.2, mode,
                                                     loss_scale_factor=64)
    ours.loss.backward()
    theirs.backward()
    close(ours.loss, theirs, "loss")
    close(ours.metrics["vf_clipfrac"], clipfrac, "clipfrac")
    close(ours_v.grad, verl_v.grad, "gradient")


def test_entropy_equals_verls_at_ordinary_logits():
    logits = torch.randn(4, 9, 500, generator=torch.Generator().manual_seed(11)) * 3
    close(entropy_from_logits(logits), verl_F.entropy_from_logits(logits))


def test_deviation_entropy_is_the_more_precise_at_peaked_logits():
    """docs/algorithms.md: verl's logsumexp(x) - sum(p x) cancels two numbers of the size of the
    logits; rlcore's -sum(p log p) does not. At logits of ~180 they agree to 3e-5 (absolute, nats),
    and rlcore's is the closer to the fp64 entropy."""
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(12)) * 2
    logits[:, 0] += 180.0
    logits[:, 1] += 178.0
    exact = entropy_from_logits(logits.double())
    ours, theirs = entropy_from_logits(logits), verl_F.entropy_from_logits(logits)
    torch.testing.assert_close(ours, theirs.float(), rtol=0.0, atol=3e-5)
    our_error, their_error = (ours.double() - exact).abs().max(), (theirs.double() - exact).abs().max()
    assert our_error < their_error, (our_error, their_error)
    assert math.isfinite(float(our_error))
