import pytest
import torch

from rlcore.algorithms.dapo import filter_groups, overlong_penalty


def test_groups_whose_metric_is_all_equal_are_dropped():
    ids = torch.tensor([4, 4, 1, 1, 9, 4, 1, 2])
    acc = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    # group 4: 1, 1, 1 (drop); group 1: 0, 1, 0 (keep); groups 9 and 2 have one sample each (keep, as verl)
    assert filter_groups(ids, acc).tolist() == [False, False, True, True, True, False, True, True]


def test_all_equal_by_exact_comparison():
    ids = torch.tensor([0, 0, 0])
    assert filter_groups(ids, torch.tensor([0.1, 0.1, 0.1])).tolist() == [False] * 3
    assert filter_groups(ids, torch.tensor([0.1, 0.1, 0.1000001])).tolist() == [True] * 3


def test_overlong_penalty_by_hand():
    # max 20 tokens, buffer 8: free up to 12, then -1/8 per token times the factor 0.5
    lengths = torch.tensor([5, 12, 13, 16, 20])
    assert overlong_penalty(lengths, 20, 8, 0.5).tolist() == pytest.approx([0.0, 0.0, -0.0625, -0.25, -0.5])


def test_overlong_penalty_without_a_buffer_is_zero():
    assert overlong_penalty(torch.tensor([20, 30]), 20, 0, 1.0).tolist() == [0.0, 0.0]
