import statistics

import pytest
import torch

from rlcore.algorithms.groups import group_all_equal, group_stats, group_sum

IDS = torch.tensor([5, 2, 5, 9, 2, 5])  # interleaved, not 0..G-1
VALUES = torch.tensor([1.0, 4.0, 3.0, 7.0, 0.0, 8.0])


def test_group_sum_broadcasts_each_groups_total():
    assert group_sum(VALUES, IDS).tolist() == [12.0, 4.0, 12.0, 7.0, 4.0, 12.0]


def test_group_stats_match_statistics_module():
    stats = group_stats(VALUES, IDS, torch.ones(6, dtype=torch.bool))
    for i in range(6):
        members = [VALUES[j].item() for j in range(6) if IDS[j] == IDS[i]]
        assert stats.count[i].item() == len(members)
        assert stats.mean[i].item() == pytest.approx(statistics.mean(members))
        expected_std = statistics.stdev(members) if len(members) > 1 else 0.0
        assert stats.std[i].item() == pytest.approx(expected_std, abs=1e-6)


def test_group_stats_leave_out_samples_that_do_not_count():
    counts = torch.tensor([True, True, False, True, True, True])
    stats = group_stats(VALUES, IDS, counts)
    assert stats.count[0].item() == 2 and stats.mean[0].item() == pytest.approx(4.5)


def test_group_all_equal_is_exact():
    ids = torch.tensor([0, 0, 0, 1, 1])
    # 0.1 three times: a float mean can differ from 0.1 in the last bit; equality must not
    values = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0])
    assert group_all_equal(values, ids).tolist() == [True, True, True, False, False]
