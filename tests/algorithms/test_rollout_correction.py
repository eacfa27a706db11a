"""Rollout importance sampling weights, rejections and metrics, worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.algorithms.rollout_correction import rollout_importance_weights

LOG2 = math.log(2.0)
# two sequences: row 0 has ratios 2, 1/4, 1 (3 tokens); row 1 has ratios 1, 8 and padding
OLD = torch.tensor([[LOG2, -2 * LOG2, 0.0, 0.0], [0.0, 3 * LOG2, 0.0, 0.0]])
ROLLOUT = torch.zeros(2, 4)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=1e-5)


def test_token_level_truncation_caps_the_weights_and_rejects_nothing():
    out = rollout_importance_weights(OLD, ROLLOUT, MASK, upper=2.0)
    close(out.weights, [[2.0, 0.25, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0]])
    assert torch.equal(out.response_mask, MASK)
    metrics = out.metrics
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)  # the weights applied: truncated
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)  # the raw 8 > 2
    assert metrics["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 5)  # 1/4 < 1/2
    # weights 2, 1/4, 1 | 1, 2: mean 1.25, mean of squares 10.0625 / 5 (as verl: of the clamped weights)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.25)
    assert metrics["rollout_corr/rollout_is_std"] == pytest.approx(math.sqrt(2.0125 - 1.25**2))
    assert metrics["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.25**2 / 2.0125)
    # per sequence: mean weights 3.25 / 3 and 1.5; raw means 3.25 / 3 and 4.5 (above 2)
    assert metrics["rollout_corr/rollout_is_seq_mean"] == pytest.approx((3.25 / 3 + 1.5) / 2)
    assert metrics["rollout_corr/rollout_is_seq_max_deviation"] == pytest.approx(0.5)
    assert metrics["rollout_corr/rollout_is_seq_fraction_high"] == pytest.approx(0.5)
    # the rollout's log-probs are all 0 (perplexity 1); the trainer's mean log-probs per sequence are
    # -log 2 / 3 and 1.5 log 2
    assert metrics["rollout_corr/training_ppl"] == pytest.approx((2 ** (1 / 3) + 2 ** -1.5) / 2)
    assert metrics["rollout_corr/rollout_ppl"] == pytest.approx(1.0)
    assert metrics["rollout_corr/chi2_token"] == pytest.approx((4 + 1 / 16 + 1 + 1 + 64) / 5 - 1)
    assert metrics["rollout_corr/chi2_seq"] == pytest.approx((0.5**2 + 8**2) / 2 - 1)  # products 1/2 and 8


def test_token_level_masking_keeps_true_ratios_and_drops_tokens_outside_the_bounds():
    out = rollout_importance_weights(OLD, ROLLOUT, MASK, upper=4.0, lower=0.5, mode="mask")
    close(out.weights, [[2.0, 0.25, 1.0, 0.0], [1.0, 8.0, 0.0, 0.0]])
    assert out.response_mask.tolist() == [[1, 0, 1, 0], [1, 0, 0, 0]]
    assert out.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert out.metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1.0)  # both rows lose one


def test_sequence_and_geometric_levels_weigh_whole_sequences():
    sequence = rollout_importance_weights(OLD, ROLLOUT, MASK, upper=100.0, level="sequence")
    close(sequence.weights, [[0.5, 0.5, 0.5, 0.0], [8.0, 8.0, 0.0, 0.0]])  # 2 * 1/4 * 1; 1 * 8
    geometric = rollout_importance_weights(OLD, ROLLOUT, MASK, upper=100.0, level="geometric")
    close(geometric.weights, [[0.5 ** (1 / 3)] * 3 + [0.0], [8 ** 0.5] * 2 + [0.0, 0.0]])


def test_a_veto_drops_every_sequence_with_a_tiny_ratio():
    old = OLD.clone()
    old[1, 0] = -20.0  # ratio e^-20 in row 1
    out = rollout_importance_weights(old, ROLLOUT, MASK, upper=2.0, veto=1e-4)
    assert out.response_mask.tolist() == [[1, 1, 1, 0], [0, 0, 0, 0]]
    assert out.metrics["rollout_corr/rollout_is_veto_fraction"] == pytest.approx(0.5)
    assert out.weights[1, 0] > 0  # the weights stay true (truncated) ratios; the mask rejects


def test_identical_policies_give_unit_weights_and_no_mismatch():
    log_probs = torch.log(torch.rand(3, 5) * 0.9 + 0.05)
    mask = torch.ones(3, 5, dtype=torch.long)
    out = rollout_importance_weights(log_probs, log_probs.clone(), mask, upper=2.0, mode="mask")
    close(out.weights, torch.ones(3, 5).tolist())
    metrics = out.metrics
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0)
    assert metrics["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.0)
    assert metrics["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["rollout_corr/k3_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["rollout_corr/log_prob_abs_diff"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["rollout_corr/chi2_token"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["rollout_corr/training_ppl"] == pytest.approx(metrics["rollout_corr/rollout_ppl"])


def test_the_mismatch_kl_estimates_kl_of_rollout_to_training():
    rollout = torch.log(torch.tensor([[0.5, 0.25]]))
    old = torch.log(torch.tensor([[0.25, 0.25]]))
    out = rollout_importance_weights(old, rollout, torch.ones(1, 2), upper=10.0)
    assert out.metrics["rollout_corr/kl"] == pytest.approx(LOG2 / 2)  # mean of log(q/p): log 2, 0
    assert out.metrics["rollout_corr/k3_kl"] == pytest.approx(((0.5 + LOG2 - 1) + 0.0) / 2)
    assert out.metrics["rollout_corr/log_prob_abs_diff"] == pytest.approx(LOG2 / 2)  # |log 2|, 0


def test_batch_normalization_divides_the_truncated_weights_by_their_batch_mean():
    """Token level: truncated weights 2, 1/4, 1, 1, 2 average 1.25 over the 5 tokens. Sequence level:
    row 0's ratio is 2 * 1/4 * 1 = 1/2, row 1's 8 truncated to 2: the sequences average 1.25 too."""
    tokens = rollout_importance_weights(OLD, ROLLOUT, MASK, upper=2.0, batch_normalize=True)
    close(tokens.weights, [[1.6, 0.2, 0.8, 0.0], [0.8, 1.6, 0.0, 0.0]])
    assert tokens.metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.25)
    sequences = rollout_importance_weights(OLD, ROLLOUT, MASK, upper=2.0, level="sequence", batch_normalize=True)
    close(sequences.weights, [[0.4, 0.4, 0.4, 0.0], [1.6, 1.6, 0.0, 0.0]])
    plain = rollout_importance_weights(OLD, ROLLOUT, MASK, upper=2.0, level="sequence")
    assert "rollout_corr/rollout_is_batch_norm_factor" not in plain.metrics


def test_rejection_at_its_own_level_drops_tokens_while_the_weights_stay_per_sequence():
    """Sequence weights (row 0: 1/2, row 1: 8 truncated to 2) with token rejection in [0.6, 1.6]:
    the tokens of ratio 2, 1/4 and 8 are dropped, the weights are untouched."""
    out = rollout_importance_weights(OLD, ROLLOUT, MASK, upper=2.0, level="sequence", reject=("token", 0.6, 1.6))
    close(out.weights, [[0.5, 0.5, 0.5, 0.0], [2.0, 2.0, 0.0, 0.0]])
    assert out.response_mask.tolist() == [[0, 0, 1, 0], [1, 0, 0, 0]]
    assert out.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 5)


def test_divergence_criteria_reject_beside_the_weights_and_without_them():
    from rlcore.algorithms.rollout_correction import correct_batch
    from rlcore.batch import Batch
    from rlcore.config.schema import AlgorithmConfig

    batch = Batch({"old_log_probs": OLD, "rollout_log_probs": ROLLOUT, "response_mask": MASK})
    # token_k1 keeps 1/r in [0.5, 2]: r = 2, 1/4, 1 | 1, 8 -> the 1/4 and the 8 leave
    rejecting = AlgorithmConfig(rollout_is_threshold=2.0, rollout_rs_criteria={"token_k1": 2.0})
    corrected, metrics = correct_batch(batch, rejecting, "")
    assert "rollout_is_weights" not in corrected  # rollout_is is false: rejection only
    assert corrected["rollout_is_response_mask"].tolist() == [[1, 0, 1, 0], [1, 0, 0, 0]]
    assert metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 5)
    weighted, _ = correct_batch(batch, AlgorithmConfig(rollout_is_threshold=2.0, rollout_is=True,
                                                       rollout_rs_criteria={"token_k1": 2.0}), "")
    close(weighted["rollout_is_weights"], [[2.0, 0.25, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0]])
    assert weighted["rollout_is_response_mask"].tolist() == [[1, 0, 1, 0], [1, 0, 0, 0]]
    # in bypass mode the actor corrects each micro-batch itself (rlcore.algorithms.bypass)
    bypassed, metrics = correct_batch(batch, AlgorithmConfig(rollout_is_threshold=2.0, rollout_bypass=True), "")
    assert (bypassed, metrics) == (batch, {})


def test_sequences_without_response_tokens_count_in_no_sequence_statistic():
    """The per-sequence statistics are over the sequences with a response token (selected, never indexed):
    a third, empty row changes none of them; a batch without any response token reports zeros, which
    add nothing to an update's token-weighted sum, where infinities or NaNs would poison it."""
    with_empty_row = rollout_importance_weights(torch.cat([OLD, torch.full((1, 4), 5.0)]), torch.zeros(3, 4),
                                                torch.cat([MASK, torch.zeros(1, 4, dtype=torch.long)]), upper=2.0)
    alone = rollout_importance_weights(OLD, ROLLOUT, MASK, upper=2.0)
    assert with_empty_row.metrics.keys() == alone.metrics.keys()
    for key, value in alone.metrics.items():
        assert float(with_empty_row.metrics[key]) == pytest.approx(float(value), rel=1e-6, abs=1e-7), key
    assert float(alone.metrics["rollout_corr/rollout_is_seq_max"]) == pytest.approx(1.5)  # (1 + 2) / 2 truncated
    assert float(alone.metrics["rollout_corr/log_ppl_diff_max"]) == pytest.approx(LOG2 / 3)  # row 0: -(1 - 2) log 2 / 3
    assert float(alone.metrics["rollout_corr/log_ppl_diff_min"]) == pytest.approx(-1.5 * LOG2)  # row 1: -3 log 2 / 2
    empty = rollout_importance_weights(OLD, ROLLOUT, torch.zeros(2, 4, dtype=torch.long), upper=2.0)
    assert all(float(value) == 0.0 for value in empty.metrics.values()), empty.metrics
