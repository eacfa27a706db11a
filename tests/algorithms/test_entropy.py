import math
import shutil

import pytest
import torch

import logging

from rlcore.algorithms.entropy import (ChosenLogProb, FusedKernels, chunk_backward, chunk_forward, entropy_from_logits,
                                      token_log_probs)


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
    for compute in (plain_log_probs, lambda x, t, temp: ChosenLogProb.apply(x, t, temp, 4)[0]):  # 4 rows: 6 chunks
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
    ChosenLogProb.apply(logits, targets, 0.8, 2)[0].sum().backward()
    exact = (torch.nn.functional.one_hot(targets, 9).double() - (logits.detach().double() / 0.8).softmax(-1)) / 0.8
    torch.testing.assert_close(logits.grad.double(), exact, rtol=0, atol=1e-6)


def test_token_log_probs_give_the_entropy_at_the_sampling_temperature():
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 3, 20, generator=generator).to(torch.bfloat16)
    targets = torch.randint(0, 20, (2, 3), generator=generator)
    log_probs, entropy = token_log_probs(logits, targets, 0.6, with_entropy=True)
    torch.testing.assert_close(log_probs, plain_log_probs(logits, targets, 0.6), rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy, entropy_from_logits(logits.float() / 0.6), rtol=0, atol=1e-6)


# -- the chunks the compiled kernels run (chunk_forward, chunk_backward), eager here ---------------------------

def eager_kernels():
    """FusedKernels with the compiler left out: the same math and the same plumbing, run eager."""
    return FusedKernels(compiler=lambda function, **options: function)


def broken_kernels(failing: str):
    """FusedKernels whose ``failing`` kernel ("forward" or "backward") fails as a compiler would."""
    def compiler(function, **options):
        if function.__name__ == f"chunk_{failing}":
            def fails(*args):
                raise RuntimeError("no C compiler found\nmore detail")
            return fails
        return function
    return FusedKernels(compiler=compiler)


def logits_with_a_masked_token(dtype, seed=7):
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 5, 40, generator=generator) * 4).to(dtype)
    logits[1, 2, 7] = -math.inf  # a token masked out of the vocabulary, never a target below
    targets = torch.randint(0, 40, (3, 5), generator=generator)
    targets[1, 2] = 8
    return logits, targets, torch.randn(3, 5, generator=generator)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_fused_chunks_equal_the_eager_ones(dtype, temperature):
    """Log-probs, the entropy metric and the logits' gradient through the fused chunks (3 rows at a time:
    5 chunks, the last shorter) equal the eager chunks' and entropy_from_logits'."""
    base, targets, weights = logits_with_a_masked_token(dtype)
    results = []
    for kernels in (None, eager_kernels()):
        logits = base.clone().requires_grad_(True)
        log_probs, entropy = ChosenLogProb.apply(logits, targets, temperature, 3, kernels, kernels is not None)
        (log_probs * weights).sum().backward()
        results.append((log_probs.detach(), entropy, logits.grad))
    (eager, no_entropy, eager_grad), (fused, entropy, fused_grad) = results
    assert no_entropy is None and entropy.shape == (3, 5) and not entropy.requires_grad
    torch.testing.assert_close(fused, eager, rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy, entropy_from_logits(base.float() / temperature), rtol=0, atol=1e-5)
    assert fused_grad.dtype == dtype and torch.isfinite(fused_grad).all()
    torch.testing.assert_close(fused_grad, eager_grad, **({"rtol": 1e-6, "atol": 1e-7} if dtype == torch.float32
                                                          else {"rtol": 0, "atol": 0}))


def test_chunk_backward_is_onehot_minus_softmax_over_the_temperature():
    generator = torch.Generator().manual_seed(8)
    logits = torch.randn(4, 9, generator=generator, dtype=torch.float64)
    chosen = torch.randint(0, 9, (4, 1), generator=generator)
    incoming = torch.randn(4, 1, generator=generator, dtype=torch.float64)
    _, lse, _ = chunk_forward(logits, chosen, 0.8, False)
    exact = (torch.nn.functional.one_hot(chosen[:, 0], 9).double() - (logits / 0.8).softmax(-1)) / 0.8 * incoming
    torch.testing.assert_close(chunk_backward(logits.float(), chosen, lse, incoming.float(), 0.8).double(), exact,
                               rtol=0, atol=1e-6)


@pytest.mark.parametrize("failing", ["forward", "backward"])
def test_kernels_that_fail_to_compile_fall_back_to_the_eager_chunks(failing, monkeypatch, caplog):
    """A compiler that fails (no C compiler, an unsupported device) costs speed, not the job: the call that
    met it gets the eager chunks' values and gradient, the failure is reported once, and later calls
    skip the compiled kernels."""
    import rlcore.algorithms.entropy as entropy_module
    kernels = broken_kernels(failing)
    monkeypatch.setattr(entropy_module, "fused_kernels", lambda logits: None if kernels.failed else kernels)
    base, targets, weights = logits_with_a_masked_token(torch.bfloat16, seed=9)
    results = []
    with caplog.at_level(logging.WARNING, logger="rlcore.algorithms.entropy"):
        for _ in range(2):
            logits = base.clone().requires_grad_(True)
            log_probs, entropy = token_log_probs(logits, targets, 1.0, with_entropy=True)
            (log_probs * weights).sum().backward()
            results.append((log_probs.detach(), entropy, logits.grad))
    logits = base.clone().requires_grad_(True)
    expected, _ = ChosenLogProb.apply(logits, targets, 1.0, 4)
    (expected * weights).sum().backward()
    for log_probs, entropy, grad in results:
        torch.testing.assert_close(log_probs, expected.detach(), rtol=0, atol=0)
        torch.testing.assert_close(entropy, entropy_from_logits(base), rtol=0, atol=1e-5)
        torch.testing.assert_close(grad, logits.grad, rtol=0, atol=0)
    assert kernels.failed == "RuntimeError: no C compiler found\nmore detail"
    reports = [r.getMessage() for r in caplog.records if "compiled log-prob kernels" in r.getMessage()]
    assert reports == ["the compiled log-prob kernels failed to build (RuntimeError: no C compiler found); the eager "
                       "chunks are used instead (set RLCORE_FUSED_LOG_PROBS=0 to skip compiling them)"]


def test_the_fused_kernels_are_for_platforms_whose_kernels_torch_compile_builds(monkeypatch):
    import rlcore.algorithms.entropy as entropy_module
    from rlcore.runtime.platforms import CpuPlatform, CudaPlatform, current_platform
    assert CudaPlatform.compiles_kernels and not CpuPlatform.compiles_kernels
    if not current_platform().compiles_kernels:
        assert entropy_module.fused_kernels(torch.zeros(2, 3)) is None
    monkeypatch.setenv("RLCORE_FUSED_LOG_PROBS", "0")
    assert entropy_module.fused_kernels(torch.zeros(2, 3, device=current_platform().device_type)) is None


def compiled_against_eager(device: str, rows: int, vocabulary: int, chunk_rows: int, temperature: float):
    """Log-probs, entropies and gradients of bf16 logits through the compiled kernels and the eager chunks."""
    generator = torch.Generator().manual_seed(10)
    base = (torch.randn(rows, vocabulary, generator=generator) * 3).to(torch.bfloat16).to(device)
    targets = torch.randint(0, vocabulary, (rows,), generator=generator).to(device)
    weights = torch.randn(rows, generator=generator).to(device)
    kernels, results = FusedKernels(), []
    for fused in (None, kernels):
        logits = base.clone().requires_grad_(True)
        log_probs, entropy = ChosenLogProb.apply(logits, targets, temperature, chunk_rows, fused, fused is not None)
        (log_probs * weights).sum().backward()
        results.append((log_probs.detach(), entropy, logits.grad))
    assert kernels.failed is None
    (eager, _, eager_grad), (fused, entropy, fused_grad) = results
    torch.testing.assert_close(fused, eager, rtol=0, atol=2e-5)
    torch.testing.assert_close(entropy, entropy_from_logits(base, chunk_size=chunk_rows, temperature=temperature),
                               rtol=0, atol=2e-4)
    torch.testing.assert_close(fused_grad.float(), eager_grad.float(), rtol=0.01, atol=1e-6)


@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")),
                    reason="torch.compile on the CPU needs a C compiler")
def test_the_compiled_kernels_equal_the_eager_chunks_on_the_cpu():
    compiled_against_eager("cpu", rows=70, vocabulary=300, chunk_rows=32, temperature=0.7)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the compiled kernels run on the GPU machine")
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_compiled_kernels_equal_the_eager_chunks_on_a_cuda_device(temperature):
    """SmolLM2's vocabulary, a chunk and a half of rows."""
    compiled_against_eager("cuda", rows=3072, vocabulary=49152, chunk_rows=2048, temperature=temperature)
