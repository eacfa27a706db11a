"""verl's divergence-based rejection criteria (rollout_rs), worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.algorithms.rejection import CRITERIA, Criterion, parse_criteria, rejection_mask

LOG2 = math.log(2.0)
# log r = log(pi_train / pi_rollout): row 0 has r = 2, 1/4, 1; row 1 has r = 1, 8 and padding
LOG_RATIO = torch.tensor([[LOG2, -2 * LOG2, 0.0, 99.0], [0.0, 3 * LOG2, 0.0, -99.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_the_eleven_criteria_are_verls():
    assert set(CRITERIA) == {"token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                             "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"}


def test_token_k1_bounds_the_inverse_ratio_as_verl():
    # k1 = -log r keeps log(0.3) <= -log r <= log(1.6): pi_rollout / pi_train = 1/r in [0.3, 1.6], i.e.
    # r in [0.625, 3.33]: 2 and 1 stay, 1/4 (1/r = 4) goes, 8 (1/r = 1/8) goes
    kept, metrics = rejection_mask(LOG_RATIO, MASK, (Criterion("token_k1", 1.6, 0.3),))
    assert kept.tolist() == [[True, False, True, False], [True, False, False, False]]
    assert metrics["rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 5)
    assert metrics["rollout_rs_token_k1_seq_masked_fraction"] == pytest.approx(1.0)
    assert metrics["rollout_rs_token_k1_mean"] == pytest.approx((-LOG2 + 2 * LOG2 - 3 * LOG2) / 5)
    assert metrics["rollout_rs_token_k1_max"] == pytest.approx(2 * LOG2)
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(2 / 5)


def test_sequence_criteria_keep_or_drop_whole_sequences():
    # k2 = (log r)^2 / 2: row 0 has (ln2)^2/2, 2 (ln2)^2, 0 -> max 2 (ln2)^2 = 0.961; row 1: 0, 4.5 (ln2)^2 = 2.16
    kept, metrics = rejection_mask(LOG_RATIO, MASK, (Criterion("seq_max_k2", 2.0),))
    assert kept.tolist() == [[True, True, True, False], [False, False, False, False]]
    assert metrics["rollout_rs_seq_max_k2_max"] == pytest.approx(4.5 * LOG2**2)
    assert metrics["rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    # k3 = r - 1 - log r: row 0 sums to (1 - ln2) + (1/4 - 1 + 2 ln2) + 0 = 0.25 + ln2 = 0.943;
    # row 1 to 0 + (7 - 3 ln2) = 4.92; their means 0.314 and 2.46
    for name, bound, row0_kept, row1_kept in (("seq_sum_k3", 1.0, True, False), ("seq_mean_k3", 2.5, True, True),
                                              ("seq_mean_k3", 0.3, False, False), ("seq_sum_k3", 5.0, True, True)):
        kept, _ = rejection_mask(LOG_RATIO, MASK, (Criterion(name, bound),))
        assert kept[0, :3].tolist() == [row0_kept] * 3 and kept[1, :2].tolist() == [row1_kept] * 2, (name, bound)
    # seq_sum_k1 = -sum log r: row 0 -(ln2 - 2 ln2) = ln2 (1/r = 2); row 1 -3 ln2 (1/r = 1/8): keep within [0.5, 4]
    kept, _ = rejection_mask(LOG_RATIO, MASK, (Criterion("seq_sum_k1", 4.0, 0.5),))
    assert kept.tolist() == [[True, True, True, False], [False, False, False, False]]


def test_a_token_is_kept_only_if_every_criterion_keeps_it():
    criteria = (Criterion("token_k1", 2.0, 0.5), Criterion("seq_max_k2", 2.0))
    kept, metrics = rejection_mask(LOG_RATIO, MASK, criteria)
    # token_k1 drops 1/4 (1/r = 4) and 8; seq_max_k2 drops row 1
    assert kept.tolist() == [[True, False, True, False], [False, False, False, False]]
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(3 / 5)
    assert {"rollout_rs_token_k1_masked_fraction", "rollout_rs_seq_max_k2_masked_fraction"} <= set(metrics)


def test_criteria_are_parsed_with_verls_defaults_and_errors_name_the_setting():
    assert parse_criteria({"token_k1": 4.0, "seq_mean_k1": [0.5, 2], "seq_max_k3": 0.1}, "x") == (
        Criterion("token_k1", 4.0, 0.25), Criterion("seq_mean_k1", 2.0, 0.5), Criterion("seq_max_k3", 0.1))
    with pytest.raises(ValueError, match="x: unknown criterion 'seq_max_k1'"):
        parse_criteria({"seq_max_k1": 2.0}, "x")
    with pytest.raises(ValueError, match=r"x.token_k2: expected a positive number \(the upper bound of the divergence"):
        parse_criteria({"token_k2": [0.5, 2.0]}, "x")
    with pytest.raises(ValueError, match="x.token_k1: the lower bound 3.0 is above the upper bound 2.0"):
        parse_criteria({"token_k1": [3.0, 2.0]}, "x")
