import math

import pytest
import torch

from rlcore.algorithms.entropy import ChosenLogProb, entropy_from_logits, token_log_probs


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


# -- the targets' log-probs, a chunk of rows at a time (ChosenLogProb) --------------------------------------

def plain_log_probs(logits, targets, temperature):
    """The form token_log_probs had before chunking: every logit copied to fp32 at once."""
    scaled = logits.float() / temperature
    return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - scaled.logsumexp(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_log_probs_and_gradients_equal_the_plain_form(dtype, temperature):
    generator = torch.Generator().manual_seed(3)
    base = (torch.randn(3, 7, 50, generator=generator) * 4).to(dtype)
    base[0, 1, 5] = -math.inf  # a token masked out of the vocabulary, never the target below
    targets = torch.randint(0, 50, (3, 7), generator=generator)
    targets[0, 1] = 6
    weights = torch.randn(3, 7, generator=generator)
    results = []
    for compute in (plain_log_probs, lambda x, t, temp: ChosenLogProb.apply(x, t, temp, 4)):  # 4 rows: 6 chunks
        logits = base.clone().requires_grad_(True)
        log_probs = compute(logits, targets, temperature)
        (log_probs * weights).sum().backward()
        results.append((log_probs.detach(), logits.grad))
    (plain, plain_grad), (chunked, chunked_grad) = results
    assert chunked.dtype == torch.float32 and chunked.shape == (3, 7)
    torch.testing.assert_close(chunked, plain, rtol=0, atol=1e-6)
    assert chunked_grad.dtype == dtype and torch.isfinite(chunked_grad).all()
    torch.testing.assert_close(chunked_grad, plain_grad, **({} if dtype == torch.float32 else {"rtol": 0, "atol": 0}))


def test_chunked_gradient_is_onehot_minus_softmax_over_the_temperature():
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 9, generator=generator, requires_grad=True)
    targets = torch.randint(0, 9, (5,), generator=generator)
    ChosenLogProb.apply(logits, targets, 0.8, 2).sum().backward()
    exact = (torch.nn.functional.one_hot(targets, 9).double() - (logits.detach().double() / 0.8).softmax(-1)) / 0.8
    torch.testing.assert_close(logits.grad.double(), exact, rtol=0, atol=1e-6)


def test_token_log_probs_give_the_entropy_at_the_sampling_temperature():
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 3, 20, generator=generator).to(torch.bfloat16)
    targets = torch.randint(0, 20, (2, 3), generator=generator)
    log_probs, entropy = token_log_probs(logits, targets, 0.6, with_entropy=True)
    torch.testing.assert_close(log_probs, plain_log_probs(logits, targets, 0.6), rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy, entropy_from_logits(logits.float() / 0.6), rtol=0, atol=1e-6)
