"""Per-token log-probs and entropy of the policy from its logits: what every training backend
computes for the old log-probs, the reference, the loss, the entropy bonus (``actor.entropy_coeff``)
and its metric."""

from __future__ import annotations

import logging
import os

import torch
from torch import Tensor

log = logging.getLogger(__name__)


def entropy_from_logits(logits: Tensor, chunk_size: int | None = None, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature) over the last dim: (..., V) -> (...), in fp32.

    ``chunk_size`` rows (of the flattened leading dims) at a time bounds the fp32 copy of the logits,
    which for a 150k vocabulary is the largest tensor of the step.
    """
    flat = logits.reshape(-1, logits.shape[-1])  # (N, V)
    step = chunk_size or max(flat.shape[0], 1)
    parts = []
    for start in range(0, flat.shape[0], step):
        chunk = flat[start:start + step].float()
        if temperature != 1.0:
            chunk = chunk / temperature
        log_probs = torch.log_softmax(chunk, dim=-1)
        # H = -sum p log p. A token masked out of the vocabulary (logit -inf) has p = 0 and
        # log p = -inf; the floor makes its term 0 * finite = 0 instead of NaN, in the gradient too.
        log_probs = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)
        parts.append(-(log_probs.exp() * log_probs).sum(-1))
    entropy = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return entropy.reshape(logits.shape[:-1])


ENTROPY_CHUNK_ROWS = 2048  # rows of the (tokens, vocab) logits turned into fp32 at a time


def token_log_probs(logits: Tensor, targets: Tensor, temperature: float, *, with_entropy: bool,
                    entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """(..., V) logits and (...) targets -> fp32 log-probs (...) of the targets at ``temperature``
    (the distribution they were sampled from, as verl) and, if asked, the entropy (...). The entropy
    keeps its graph only with ``entropy_grad`` (an entropy bonus); else it is a metric.

    Neither is computed on an fp32 copy of all the logits: ``ChosenLogProb`` and ``entropy_from_logits``
    take ``ENTROPY_CHUNK_ROWS`` rows at a time, forward and backward, so the step's largest tensors are
    the logits themselves and their gradient, in the model's dtype. On a GPU the chunks go through
    compiled kernels (``fused_kernels``) that read each logit once or twice, and the metric's entropy comes
    out of the log-probs' own pass."""
    log_probs, entropy = ChosenLogProb.apply(logits, targets, float(temperature), ENTROPY_CHUNK_ROWS,
                                             fused_kernels(logits), with_entropy and not entropy_grad)
    if with_entropy and entropy is None:  # a graph for the bonus, or no fused kernels
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach(), chunk_size=ENTROPY_CHUNK_ROWS,
                                          temperature=temperature)
    return log_probs, entropy


class ChosenLogProb(torch.autograd.Function):
    """log softmax(logits / T)[target] for each row, in fp32, a chunk of rows at a time, and, with
    ``with_entropy`` and ``fused`` kernels, the entropy of each row as a metric, without a graph (else None).
    Kernels that fail to compile leave both passes to the eager chunks.

    The plain form (``logits.float()``, ``gather``, ``logsumexp``) keeps an fp32 copy of every logit for
    the backward and makes more in it, each 4 bytes x tokens x vocabulary: 4.1 GiB at one 22.5k-token
    micro-batch of SmolLM2 (49k vocabulary), the allocation the GSM8K example's first update on an 80 GB
    GPU could not make (2026-12-05). This keeps the logits (the graph holds them anyway) and one fp32
    log-sum-exp per row; the backward rebuilds each chunk's softmax and writes the gradient,
    (onehot(target) - softmax(logits / T)) / T times the incoming one, in the logits' dtype."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, chunk_rows: int,
                fused: FusedKernels | None = None, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        flat, chosen = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, 1)
        out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        entropy = None
        if fused is not None:
            try:
                entropy = torch.empty_like(out) if with_entropy else None
                for start in range(0, flat.shape[0], chunk_rows):
                    rows = slice(start, start + chunk_rows)
                    out[rows], lse[rows], chunk_entropy = fused.forward(flat[rows], chosen[rows], temperature,
                                                                        with_entropy)
                    if entropy is not None:
                        entropy[rows] = chunk_entropy
            except FusedKernelsFailed:
                fused = entropy = None
        if fused is None:
            for start in range(0, flat.shape[0], chunk_rows):
                rows = slice(start, start + chunk_rows)
                scaled = _scaled(flat[rows], temperature)
                lse[rows] = scaled.logsumexp(-1)
                out[rows] = scaled.gather(-1, chosen[rows]).squeeze(-1) - lse[rows]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk_rows, ctx.fused = temperature, chunk_rows, fused
        if entropy is None:
            return out.reshape(targets.shape), None
        entropy = entropy.reshape(targets.shape)
        ctx.mark_non_differentiable(entropy)
        return out.reshape(targets.shape), entropy

    @staticmethod
    def backward(ctx, grad_out: Tensor, _grad_entropy: Tensor | None = None) -> tuple[Tensor | None, None, ...]:
        logits, targets, lse = ctx.saved_tensors
        flat, chosen = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, 1)
        incoming = grad_out.reshape(-1, 1).float()
        grad = torch.empty_like(flat)
        if ctx.fused is not None:
            try:
                for start in range(0, flat.shape[0], ctx.chunk_rows):
                    rows = slice(start, start + ctx.chunk_rows)
                    grad[rows] = ctx.fused.backward(flat[rows], chosen[rows], lse[rows], incoming[rows],
                                                    ctx.temperature)
                return grad.reshape(logits.shape), None, None, None, None, None
            except FusedKernelsFailed:
                pass
        for start in range(0, flat.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            probs = (_scaled(flat[rows], ctx.temperature) - lse[rows].unsqueeze(-1)).exp_()
            chunk = probs.mul_(-incoming[rows]).scatter_add_(-1, chosen[rows], incoming[rows])
            if ctx.temperature != 1.0:
                chunk.div_(ctx.temperature)
            grad[rows] = chunk
        return grad.reshape(logits.shape), None, None, None, None, None


# -- the same chunks through compiled kernels, on GPUs ---------------------------------------------------------
#
# Eager, each step above is a kernel of its own over a (rows, vocabulary) fp32 tensor: the bf16-to-fp32
# copy, the log-sum-exp's four passes, the entropy's five, and the backward's five. On the GSM8K job's
# 135M model (49k vocabulary, ~250k tokens a step) fp32 copies, subtractions and products were among the
# trainer's largest kernels in the GPU trace of 2026-12-06, most likely these passes. Compiled, the
# forward of a chunk reads its logits once or twice and writes three numbers a row, the backward reads
# them once and writes the gradient.

FUSED_LOG_PROBS_ENV = "RLCORE_FUSED_LOG_PROBS"


def chunk_forward(logits: Tensor, chosen: Tensor, temperature: float, with_entropy: bool
                  ) -> tuple[Tensor, Tensor, Tensor | None]:
    """A chunk's (N, V) logits and (N, 1) targets -> fp32 (N,) log-probs of the targets, log-sum-exps and,
    if asked, entropies, at ``temperature``: the math the compiled forward runs (plain torch)."""
    scaled = logits.float() / temperature
    lse = torch.logsumexp(scaled, dim=-1)
    picked = scaled.gather(-1, chosen).squeeze(-1) - lse
    if not with_entropy:
        return picked, lse, None
    log_p = scaled - lse.unsqueeze(-1)
    probs = torch.exp(log_p)
    # H = -sum p log p; a token masked out of the vocabulary (log p = -inf) has p = 0 and adds 0, not NaN
    entropy = -torch.where(probs > 0, probs * log_p, 0.0).sum(-1)
    return picked, lse, entropy


def chunk_backward(logits: Tensor, chosen: Tensor, lse: Tensor, incoming: Tensor, temperature: float) -> Tensor:
    """The gradient (N, V), in the logits' dtype, of the chunk's log-probs given ``incoming`` (N, 1):
    (onehot(target) - softmax(logits / T)) / T x incoming: the math the compiled backward runs."""
    probs = torch.exp(logits.float() / temperature - lse.unsqueeze(-1))
    vocabulary = torch.arange(logits.shape[-1], device=logits.device)
    onehot = (vocabulary.unsqueeze(0) == chosen).to(probs.dtype)
    return ((onehot - probs) * (incoming / temperature)).to(logits.dtype)


class FusedKernels:
    """``chunk_forward`` and ``chunk_backward`` compiled (``torch.compile``, shapes dynamic: the last chunk
    is shorter) the first time each runs. A compilation that fails is reported once and the eager chunks
    are used from then on: a missing compiler slows the step, it does not stop the job."""

    def __init__(self, compiler=torch.compile):
        self._compiled = {"forward": compiler(chunk_forward, dynamic=True),
                          "backward": compiler(chunk_backward, dynamic=True)}
        self._proven: set[tuple] = set()
        self.failed: str | None = None

    def _run(self, name: str, key: tuple, *args):
        if key in self._proven:
            return self._compiled[name](*args)
        try:
            result = self._compiled[name](*args)
        except Exception as error:  # noqa: BLE001 - any compiler failure: report it, go on eager
            self.failed = f"{type(error).__name__}: {error}"
            log.warning("the compiled log-prob kernels failed to build (%s); the eager chunks are used instead "
                        "(set %s=0 to skip compiling them)", self.failed.splitlines()[0], FUSED_LOG_PROBS_ENV)
            raise FusedKernelsFailed(self.failed) from error
        self._proven.add(key)
        return result

    def forward(self, logits, chosen, temperature, with_entropy):
        return self._run("forward", ("forward", with_entropy, temperature), logits, chosen, temperature,
                         with_entropy)

    def backward(self, logits, chosen, lse, incoming, temperature):
        return self._run("backward", ("backward", temperature), logits, chosen, lse, incoming, temperature)


class FusedKernelsFailed(Exception):
    """The compiled kernels failed to build: ``ChosenLogProb`` computes the chunks eager."""


_FUSED: FusedKernels | None = None


def fused_kernels(logits: Tensor) -> FusedKernels | None:
    """The compiled chunk kernels for these logits: on the devices of a platform whose kernels torch.compile
    builds (``Platform.compiles_kernels``: CUDA GPUs, and AMD ones through the same torch device type),
    unless ``RLCORE_FUSED_LOG_PROBS=0`` or their compilation failed before in this process; else None (the
    eager chunks)."""
    global _FUSED
    if os.environ.get(FUSED_LOG_PROBS_ENV, "1") == "0":
        return None
    from rlcore.runtime.platforms import current_platform

    platform = current_platform()
    if not platform.compiles_kernels or logits.device.type != platform.device_type:
        return None
    if _FUSED is None:
        _FUSED = FusedKernels()
    return None if _FUSED.failed else _FUSED


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    """A chunk of logits in fp32, divided by the temperature."""
    chunk = logits.float()
    return chunk / temperature if temperature != 1.0 else chunk


def sum_pi_squared_from_logits(logits: Tensor, chunk_size: int | None = ENTROPY_CHUNK_ROWS) -> Tensor:
    """sum_v softmax(logits)_v^2 over the last dim: (..., V) -> (...), in fp32, as
    exp(logsumexp(2 x) - 2 logsumexp(x)); ``chunk_size`` rows at a time, as ``entropy_from_logits``.
    The optimal token baseline's path-variance proxy reads it (1 - 2 pi + sum pi^2)."""
    flat = logits.reshape(-1, logits.shape[-1])  # (N, V)
    step = chunk_size or max(flat.shape[0], 1)
    parts = []
    for start in range(0, flat.shape[0], step):
        chunk = flat[start:start + step].float()
        parts.append(torch.exp(torch.logsumexp(2.0 * chunk, dim=-1) - 2.0 * torch.logsumexp(chunk, dim=-1)))
    result = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return result.reshape(logits.shape[:-1])
