import math

import pytest
import torch

from rlcore.algorithms.aggregation import LOSS_AGG_MODES, agg_loss

LOSSES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])

# Worked by hand: sequence 1 keeps 1, 2; sequence 2 keeps 4.
EXPECTED = {
    "token-mean": (1 + 2 + 4) / 3,
    "seq-mean-token-sum": ((1 + 2) + 4) / 2,
    "seq-mean-token-mean": ((1 + 2) / 2 + 4) / 2,
    # verl 0.9.1: the mean over the 2 sequences of their token sums, divided by the width T = 3
    "seq-mean-token-sum-norm": ((1 + 2) + 4) / 2 / 3,
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_each_mode_by_hand(mode):
    assert agg_loss(LOSSES, MASK, mode).item() == pytest.approx(EXPECTED[mode])


def test_sum_norm_divides_by_the_given_length():
    assert agg_loss(LOSSES, MASK, "seq-mean-token-sum-norm", norm_length=10).item() == pytest.approx(0.35)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_padding_values_and_padding_rows_change_nothing(mode):
    losses = torch.tensor([[1.0, 2.0, math.nan], [4.0, math.inf, -math.inf], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert agg_loss(losses, mask, mode).item() == pytest.approx(EXPECTED[mode])


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_empty_batch_is_zero_not_nan(mode):
    assert agg_loss(torch.ones(2, 3), torch.zeros(2, 3), mode).item() == 0.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_gradient_never_reaches_padding_and_result_is_fp32(mode):
    losses = LOSSES.to(torch.bfloat16).requires_grad_()
    loss = agg_loss(losses, MASK.bool(), mode)
    assert loss.dtype == torch.float32
    loss.backward()
    assert (losses.grad[MASK == 0] == 0).all() and (losses.grad[MASK == 1] != 0).all()


def test_unknown_mode_lists_the_known_ones():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-sum"):
        agg_loss(LOSSES, MASK, "mean")
