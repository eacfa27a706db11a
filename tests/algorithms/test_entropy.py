import math

import pytest
import torch

from rlcore.algorithms.entropy import entropy_from_logits


def entropy_loop(logits):
    exps = [math.exp(x - max(logits)) for x in logits]
    probs = [e / sum(exps) for e in exps]
    return -sum(p * math.log(p) for p in probs if p > 0)


def test_entropy_against_a_loop():
    logits = torch.tensor([[[0.0, 1.0, 2.0], [5.0, 5.0, 5.0]], [[-3.0, 0.5, 0.0], [100.0, 0.0, 0.0]]])
    out = entropy_from_logits(logits)
    assert out.shape == (2, 2)
    expected = [[entropy_loop(row.tolist()) for row in sample] for sample in logits]
    assert out.tolist() == [pytest.approx(row, abs=1e-6) for row in expected]
    assert out[0, 1].item() == pytest.approx(math.log(3))


def test_chunks_give_the_same_answer_in_fp32():
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    whole, chunked = entropy_from_logits(logits), entropy_from_logits(logits, chunk_size=4)
    assert whole.dtype == torch.float32 and torch.allclose(whole, chunked)


def test_masked_out_vocabulary_is_finite_with_a_finite_gradient():
    logits = torch.tensor([[0.0, 1.0, -math.inf, -math.inf]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    assert entropy.item() == pytest.approx(entropy_loop([0.0, 1.0]))
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()
