import pytest
import torch

from rlcore.algorithms.value import explained_variance, value_loss


def test_clipped_value_loss_by_hand():
    # token 1: v 1.0 clipped to 0.7 (old 0.5 + 0.2); (0.7 - 1.5)^2 = 0.64 beats (1.0 - 1.5)^2 = 0.25
    # token 2: v 2.0 clipped to 0.7; (2 - 0)^2 = 4 beats 0.49. Third token is padding.
    vpreds = torch.tensor([[1.0, 2.0, 50.0]], requires_grad=True)
    out = value_loss(vpreds, torch.tensor([[1.5, 0.0, 0.0]]), torch.tensor([[0.5, 0.5, 0.0]]),
                     torch.tensor([[1, 1, 0]]), cliprange_value=0.2)
    assert out.loss.item() == pytest.approx(0.5 * (0.64 + 4.0) / 2)
    assert out.metrics["vf_loss"] == pytest.approx(1.16)
    assert out.metrics["vf_clipfrac"] == pytest.approx(0.5)
    assert out.metrics["vpred_mean"] == pytest.approx(1.5)
    out.loss.backward()
    # token 1's loss is the clipped one: no gradient; token 2: d/dv 0.5 * (v - 0)^2 / 2 = v / 2
    assert vpreds.grad.tolist() == [pytest.approx([0.0, 1.0, 0.0])]


def test_value_loss_aggregation_mode():
    out = value_loss(torch.tensor([[1.0, 1.0], [3.0, 0.0]]), torch.zeros(2, 2), torch.tensor([[1.0, 1.0], [3.0, 0.0]]),
                     torch.tensor([[1, 1], [1, 0]]), cliprange_value=0.5, loss_agg_mode="seq-mean-token-sum")
    assert out.loss.item() == pytest.approx(0.5 * ((1 + 1) + 9) / 2)


def test_explained_variance_by_hand():
    mask = torch.tensor([[1, 1, 1, 0]])
    returns = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    # a constant critic explains nothing: var(returns) = 1
    assert explained_variance(torch.full((1, 4), 2.0), returns, mask) == pytest.approx(1 - 1 / (1 + 1e-5), abs=1e-6)
    # values 1.5, 2, 2.5: residuals -0.5, 0, 0.5 -> var 0.25 of var 1
    assert explained_variance(torch.tensor([[1.5, 2.0, 2.5, 0.0]]), returns, mask) == pytest.approx(0.75, rel=1e-4)
    # values 1, 1, 1: residuals 0, 1, 2 -> var 1 as well
    assert explained_variance(torch.ones(1, 4), returns, mask) == pytest.approx(1 - 1 / (1 + 1e-5), abs=1e-6)


def test_explained_variance_of_one_token_is_finite():
    assert explained_variance(torch.tensor([[0.3, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[1, 0]])) == 1.0
