"""Every estimator against a plain per-sample Python loop written here, plus hand-sized cases."""

import math
import statistics

import pytest
import torch

from rlcore.algorithms.advantages import ESTIMATORS, AdvantageInputs
from rlcore.config.schema import AlgorithmConfig

# Six samples of two prompts (ids 7 and 3, interleaved), responses of different lengths.
SCORES = [1.0, 0.5, 0.0, 0.0, 1.0, 2.0]
LENGTHS = [3, 5, 1, 4, 2, 5]
IDS = [7, 3, 7, 3, 7, 3]
T = 6
GARBAGE = 123.0  # what padded positions hold; it must never show


def make_batch(scores=SCORES, lengths=LENGTHS, ids=IDS, values=None, baseline=None, rewards=None):
    """Outcome rewards at the last response token (or the given per-token rewards), garbage on padding."""
    mask = torch.tensor([[1 if t < n else 0 for t in range(T)] for n in lengths])
    token_rewards = torch.full((len(lengths), T), GARBAGE)
    for i, n in enumerate(lengths):
        token_rewards[i, :n] = 0.0
        if rewards is None:
            token_rewards[i, n - 1] = scores[i]
        else:
            token_rewards[i, :n] = torch.tensor(rewards[i][:n])
    return AdvantageInputs(
        token_level_rewards=token_rewards, response_mask=mask, group_ids=torch.tensor(ids),
        values=None if values is None else torch.tensor(values),
        baseline_scores=None if baseline is None else torch.tensor(baseline),
        reward_components=torch.tensor(scores)[:, None],  # for gdpo: the score as the one component
        old_log_probs=torch.full((len(lengths), T), -1.0), sum_pi_squared=torch.full((len(lengths), T), 0.2))


def compute(name, batch, **config):
    return ESTIMATORS[name].compute(batch, AlgorithmConfig(**config))


def per_sample(tensor, lengths=LENGTHS):
    """The one advantage of each sample, checking it is constant over its tokens and 0 on padding."""
    out = []
    for i, n in enumerate(lengths):
        row = tensor[i].tolist()
        assert row[:n] == pytest.approx([row[0]] * n, abs=1e-6)
        assert row[n:] == [0.0] * (T - n)
        out.append(row[0])
    return out


def group_of(i, ids=IDS, scores=SCORES):
    return [scores[j] for j in range(len(ids)) if ids[j] == ids[i]]


def whiten(per_token):
    """Whiten a flat list of token values with an unbiased variance, as verl does."""
    mean = statistics.mean(per_token)
    var = statistics.variance(per_token) if len(per_token) > 1 else 0.0
    return [(x - mean) / math.sqrt(var + 1e-8) for x in per_token]


def tokens(tensor, lengths=LENGTHS):
    return [tensor[i, t].item() for i, n in enumerate(lengths) for t in range(n)]


# -- GRPO -----------------------------------------------------------------------------------------

def test_grpo_by_hand():
    # scores 1, 0, 1, 0 in one group: mean 0.5, unbiased std sqrt(1/3)
    batch = make_batch([1.0, 0.0, 1.0, 0.0], [2, 2, 2, 2], [0, 0, 0, 0])
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert per_sample(compute("grpo", batch).advantages, [2] * 4) == pytest.approx(
        [expected, -expected, expected, -expected], rel=1e-5)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_against_a_loop(norm):
    out = compute("grpo", make_batch(), norm_adv_by_std_in_grpo=norm)
    expected = []
    for i, score in enumerate(SCORES):
        group = group_of(i)
        advantage = score - statistics.mean(group)
        expected.append(advantage / (statistics.stdev(group) + 1e-6) if norm else advantage)
    assert per_sample(out.advantages) == pytest.approx(expected, rel=1e-5)
    assert torch.equal(out.returns, out.advantages)


def test_grpo_group_of_one_keeps_its_score_as_verl():
    out = compute("grpo", make_batch([2.0], [3], [0]))
    assert per_sample(out.advantages, [3]) == pytest.approx([2.0 / (1 + 1e-6)])


# -- RLOO, OPO, GPG, REINFORCE++ (baseline) -------------------------------------------------------

def test_rloo_against_a_loop():
    expected = []
    for i, score in enumerate(SCORES):
        others = [SCORES[j] for j in range(len(IDS)) if IDS[j] == IDS[i] and j != i]
        expected.append(score - statistics.mean(others))
    assert per_sample(compute("rloo", make_batch()).advantages) == pytest.approx(expected, abs=1e-6)


def test_opo_against_a_loop():
    expected = []
    for i, score in enumerate(SCORES):
        members = [j for j in range(len(IDS)) if IDS[j] == IDS[i]]
        baseline = sum(LENGTHS[j] * SCORES[j] for j in members) / sum(LENGTHS[j] for j in members)
        expected.append(score - baseline)
    assert per_sample(compute("opo", make_batch()).advantages) == pytest.approx(expected, abs=1e-6)


def test_gpg_against_a_loop():
    alpha = len(SCORES) / sum(1 for s in SCORES if s != 0)
    expected = [alpha * (s - statistics.mean(group_of(i))) for i, s in enumerate(SCORES)]
    assert per_sample(compute("gpg", make_batch()).advantages) == pytest.approx(expected, abs=1e-6)


def test_reinforce_plus_plus_baseline_against_a_loop():
    centered = [s - statistics.mean(group_of(i)) for i, s in enumerate(SCORES)]
    flat = whiten([centered[i] for i, n in enumerate(LENGTHS) for _ in range(n)])
    out = compute("reinforce_plus_plus_baseline", make_batch())
    assert tokens(out.advantages) == pytest.approx(flat, abs=1e-5)
    assert (out.advantages[make_batch().response_mask == 0] == 0).all()


# -- per-token returns: REINFORCE++, ReMax, GAE ---------------------------------------------------

TOKEN_REWARDS = [[0.1 * (i + 1) * (t + 1) - 0.3 for t in range(T)] for i in range(len(LENGTHS))]


def returns_loop(rewards, n, gamma):
    out, running = [0.0] * n, 0.0
    for t in reversed(range(n)):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_against_a_loop(gamma):
    out = compute("reinforce_plus_plus", make_batch(rewards=TOKEN_REWARDS), gamma=gamma)
    returns = [g for i, n in enumerate(LENGTHS) for g in returns_loop(TOKEN_REWARDS[i], n, gamma)]
    assert tokens(out.returns) == pytest.approx(returns, abs=1e-5)
    assert tokens(out.advantages) == pytest.approx(whiten(returns), abs=1e-5)


def test_remax_against_a_loop():
    baseline = [0.5, -1.0, 0.0, 2.0, 0.25, 1.0]
    out = compute("remax", make_batch(rewards=TOKEN_REWARDS, baseline=baseline))
    returns = [returns_loop(TOKEN_REWARDS[i], n, 1.0) for i, n in enumerate(LENGTHS)]
    assert tokens(out.returns) == pytest.approx([g for r in returns for g in r], abs=1e-5)
    expected = [g - baseline[i] for i, r in enumerate(returns) for g in r]
    assert tokens(out.advantages) == pytest.approx(expected, abs=1e-5)


def test_remax_without_baseline_scores_says_what_is_missing():
    with pytest.raises(ValueError, match="baseline_scores"):
        compute("remax", make_batch())


VALUES = [[0.05 * (i - t) + 0.2 for t in range(T)] for i in range(len(LENGTHS))]


def gae_loop(rewards, values, n, gamma, lam):
    advantages, running = [0.0] * n, 0.0
    for t in reversed(range(n)):
        next_value = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages


def test_gae_by_hand():
    # rewards 0, 1; values 0.5, 0.2; gamma = lam = 1: A1 = 1 - 0.2 = 0.8, A0 = 0 + 0.2 - 0.5 + 0.8 = 0.5
    batch = make_batch(lengths=[2], ids=[0], rewards=[[0.0, 1.0] + [0.0] * 4], values=[[0.5, 0.2] + [9.0] * 4])
    out = compute("gae", batch)
    assert out.returns[0, :2].tolist() == pytest.approx([1.0, 1.0])
    assert out.advantages[0, :2].tolist() == pytest.approx(whiten([0.5, 0.8]), abs=1e-5)
    assert out.returns[0, 2:].tolist() == [0.0] * 4 and out.advantages[0, 2:].tolist() == [0.0] * 4


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.8), (0.0, 0.5)])
def test_gae_against_a_loop(gamma, lam):
    values = [row[:n] + [GARBAGE] * (T - n) for row, n in zip(VALUES, LENGTHS)]
    out = compute("gae", make_batch(rewards=TOKEN_REWARDS, values=values), gamma=gamma, lam=lam)
    raw = [gae_loop(TOKEN_REWARDS[i], VALUES[i], n, gamma, lam) for i, n in enumerate(LENGTHS)]
    returns = [a + VALUES[i][t] for i, row in enumerate(raw) for t, a in enumerate(row)]
    assert tokens(out.returns) == pytest.approx(returns, abs=1e-5)
    assert tokens(out.advantages) == pytest.approx(whiten([a for row in raw for a in row]), abs=1e-5)


def test_gae_without_values_says_what_is_missing():
    with pytest.raises(ValueError, match="values"):
        compute("gae", make_batch())


# -- GDPO: each reward component normalised within its group ---------------------------------------

def _gdpo_batch(components, lengths, ids, summed_scores=None):
    scores = summed_scores or [sum(row) for row in components]
    batch = make_batch(scores, lengths, ids)
    return AdvantageInputs(token_level_rewards=batch.token_level_rewards, response_mask=batch.response_mask,
                           group_ids=batch.group_ids, reward_components=torch.tensor(components))


def test_gdpo_by_hand():
    # two prompts of two samples; components (accuracy, format), weights (1, 2):
    # accuracy: prompt 0 has 1, 0 -> +-1/sqrt(2) (mean 1/2, unbiased std 1/sqrt(2)); prompt 1 has 0, 0 -> 0, 0
    # format:   prompt 0 has 1, 1 -> 0, 0; prompt 1 has 1, 0 -> +-1/sqrt(2), times 2
    # summed: 1/sqrt(2) * (1, -1, 2, -2); whitened over 8 tokens (2 a sample): mean 0, unbiased variance
    # (2 * (1/2 + 1/2 + 2 + 2)) / 7 = 10/7, so (1, -1, 2, -2) * sqrt(1/2 * 7/10)
    batch = _gdpo_batch([[1.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 0.0]], [2, 2, 2, 2], [0, 0, 1, 1])
    out = compute("gdpo", batch, gdpo_reward_keys=("accuracy", "format"), gdpo_reward_weights=(1.0, 2.0))
    unit = math.sqrt(0.35)
    assert per_sample(out.advantages, [2] * 4) == pytest.approx([unit, -unit, 2 * unit, -2 * unit], rel=1e-5)
    assert torch.equal(out.returns, out.advantages)


def test_gdpo_against_a_loop_reads_the_components_not_the_summed_score():
    components = [[1.0, 0.2], [0.5, 0.9], [0.0, 0.1], [0.0, 0.3], [1.0, 0.0], [2.0, 0.4]]
    out = compute("gdpo", _gdpo_batch(components, LENGTHS, IDS, summed_scores=[9.0] * 6),
                  gdpo_reward_keys=("a", "b"))
    summed = []
    for i in range(len(IDS)):
        total = 0.0
        for k in range(2):
            column = [row[k] for row in components]
            group = group_of(i, scores=column)
            total += (column[i] - statistics.mean(group)) / (statistics.stdev(group) + 1e-6)
        summed.append(total)
    expected = whiten([summed[i] for i, n in enumerate(LENGTHS) for _ in range(n)])
    assert tokens(out.advantages) == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_gdpo_without_components_says_what_is_missing():
    batch = make_batch()
    without = AdvantageInputs(token_level_rewards=batch.token_level_rewards, response_mask=batch.response_mask,
                              group_ids=batch.group_ids)
    with pytest.raises(ValueError, match="per-component scores"):
        compute("gdpo", without, gdpo_reward_keys=("a",))


# -- the optimal token baseline ------------------------------------------------------------------

def _otb_batch(is_weights=None):
    # one prompt, two samples: row 0 three tokens, score 1 on the last; row 1 two tokens, score 0.
    # pi = 1/2, 1/2, 1/2 and sum pi^2 = 1/2: 1 - 2 pi + sum pi^2 = 1/2 a token, W = 0.5, 1.0, 1.5;
    # row 1: pi = 1/4 and sum pi^2 = 1/2: 1 a token, W = 1, 2
    half, quarter = math.log(0.5), math.log(0.25)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return AdvantageInputs(
        token_level_rewards=torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, GARBAGE]]), response_mask=mask,
        group_ids=torch.tensor([5, 5]), old_log_probs=torch.tensor([[half, half, half], [quarter, quarter, GARBAGE]]),
        sum_pi_squared=torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, GARBAGE]]), rollout_is_weights=is_weights)


def test_optimal_token_baseline_by_hand():
    # returns: 1, 1, 1 | 0, 0. Baselines: t0 (1 * 0.5 + 0 * 1) / 1.5 = 1/3, t1 (1 * 1 + 0 * 2) / 3 = 1/3;
    # t2 only row 0 reaches, past the second longest response: baseline 0 there (verl's handle_zero_tail)
    out = compute("optimal_token_baseline", _otb_batch())
    torch.testing.assert_close(out.advantages, torch.tensor([[2 / 3, 2 / 3, 1.0], [-1 / 3, -1 / 3, 0.0]]))
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))


def test_optimal_token_baseline_scales_each_path_by_its_squared_importance_weight():
    # row 1's weight 2 makes its terms 4 a token: W = 4, 8; baselines t0 0.5 / 4.5 = 1/9, t1 1 / 9
    weights = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]])
    out = compute("optimal_token_baseline", _otb_batch(weights))
    torch.testing.assert_close(out.advantages, torch.tensor([[8 / 9, 8 / 9, 1.0], [-1 / 9, -1 / 9, 0.0]]))


def test_optimal_token_baseline_leaves_a_group_of_one_its_returns_and_says_what_it_needs():
    batch = make_batch([1.0, 2.0], [2, 3], [0, 1])
    assert per_sample(compute("optimal_token_baseline", batch).advantages, [2, 3]) == pytest.approx([1.0, 2.0])
    without = AdvantageInputs(token_level_rewards=batch.token_level_rewards, response_mask=batch.response_mask,
                              group_ids=batch.group_ids)
    with pytest.raises(ValueError, match="actor.calculate_sum_pi_squared"):
        compute("optimal_token_baseline", without)


# -- what every estimator must survive ------------------------------------------------------------

OUTCOME = ["grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"]


@pytest.mark.parametrize("name", OUTCOME)
def test_group_of_identical_rewards_gives_zero_not_nan(name):
    out = compute(name, make_batch([1.0] * 4, [1, 3, 2, 1], [0, 0, 0, 0]))
    assert torch.isfinite(out.advantages).all()
    assert out.advantages.abs().max().item() < 1e-5


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_single_token_responses_are_finite(name):
    batch = make_batch([1.0, 0.0], [1, 1], [0, 0], values=[[0.3] * T, [0.1] * T], baseline=[0.5, 0.5])
    out = compute(name, batch)
    assert torch.isfinite(out.advantages).all() and torch.isfinite(out.returns).all()
    assert out.advantages.dtype == torch.float32


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_rewards_on_padding_are_ignored_and_advantages_there_are_zero(name):
    values = [[0.2] * T for _ in LENGTHS]
    clean = make_batch(values=values, baseline=[0.0] * 6)
    dirty = make_batch(values=values, baseline=[0.0] * 6)
    dirty.token_level_rewards[dirty.response_mask == 0] = -7.0
    a, b = compute(name, clean), compute(name, dirty)
    assert torch.allclose(a.advantages, b.advantages) and torch.allclose(a.returns, b.returns)
    assert (a.advantages[clean.response_mask == 0] == 0).all()


@pytest.mark.parametrize("name", OUTCOME)
def test_rows_without_response_tokens_are_left_out_of_group_statistics(name):
    padded = make_batch(SCORES + [5.0], LENGTHS + [0], IDS + [7])
    full, plain = compute(name, padded), compute(name, make_batch())
    assert torch.allclose(full.advantages[:-1], plain.advantages, atol=1e-6)
    assert (full.advantages[-1] == 0).all()


def test_what_each_estimator_needs():
    needs = {name: (e.needs_critic, e.needs_groups, e.needs_baseline_rollout) for name, e in ESTIMATORS.items()}
    assert needs == {
        "gae": (True, False, False),
        "grpo": (False, True, False),
        "rloo": (False, True, False),
        "opo": (False, True, False),
        "gpg": (False, True, False),
        "reinforce_plus_plus_baseline": (False, True, False),
        "reinforce_plus_plus": (False, False, False),
        "remax": (False, False, True),
        "gdpo": (False, True, False),
        "optimal_token_baseline": (False, True, False),
    }
    assert [name for name, e in ESTIMATORS.items() if e.needs_reward_components] == ["gdpo"]
    assert [name for name, e in ESTIMATORS.items() if e.needs_sum_pi_squared] == ["optimal_token_baseline"]
    assert all(e.doc and e.paper.startswith("https://") for e in ESTIMATORS.values())
