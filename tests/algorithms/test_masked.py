import math

import pytest
import torch

from rlcore.algorithms.masked import masked_mean, masked_var, masked_whiten

MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_masked_mean_ignores_padding_even_if_it_is_not_finite():
    values = torch.tensor([[1.0, 2.0, math.nan], [6.0, math.inf, -math.inf]])
    assert masked_mean(values, MASK).item() == pytest.approx(3.0)
    assert masked_mean(values, MASK, dim=-1).tolist() == pytest.approx([1.5, 6.0])


def test_masked_mean_of_nothing_is_zero():
    assert masked_mean(torch.ones(2, 3), torch.zeros(2, 3)).item() == 0.0


def test_masked_var_is_unbiased_and_zero_for_one_entry():
    assert masked_var(torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]]), MASK).item() == pytest.approx(1.0)
    assert masked_var(torch.tensor([5.0, 7.0]), torch.tensor([1, 0])).item() == 0.0


def test_masked_whiten_by_hand():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, -50.0, 7.0]])  # kept: 1, 2, 3 -> mean 2, var 1
    expected = [[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    assert masked_whiten(values, MASK).tolist() == [pytest.approx(row, abs=1e-6) for row in expected]


def test_masked_whiten_of_one_token_is_zero_not_nan():
    assert masked_whiten(torch.tensor([[4.0, 0.0]]), torch.tensor([[1, 0]])).tolist() == [[0.0, 0.0]]
