"""Per-token log-probs and entropy of the policy from its logits: what every training backend
computes for the old log-probs, the reference, the loss, the entropy bonus (``actor.entropy_coeff``)
and its metric."""

from __future__ import annotations

import torch
from torch import Tensor


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
    the logits themselves and their gradient, in the model's dtype."""
    log_probs = ChosenLogProb.apply(logits, targets, float(temperature), ENTROPY_CHUNK_ROWS)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach(), chunk_size=ENTROPY_CHUNK_ROWS,
                                          temperature=temperature)
    return log_probs, entropy


class ChosenLogProb(torch.autograd.Function):
    """log softmax(logits / T)[target] for each row, in fp32, a chunk of rows at a time.

    The plain form (``logits.float()``, ``gather``, ``logsumexp``) keeps an fp32 copy of every logit for
    the backward and makes more in it, each 4 bytes x tokens x vocabulary: 4.1 GiB at one 22.5k-token
    micro-batch of SmolLM2 (49k vocabulary), the allocation the GSM8K example's first update on an 80 GB
    GPU could not make (2026-12-05). This keeps the logits (the graph holds them anyway) and one fp32
    log-sum-exp per row; the backward rebuilds each chunk's softmax and writes the gradient,
    (onehot(target) - softmax(logits / T)) / T times the incoming one, in the logits' dtype."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, chunk_rows: int) -> Tensor:
        flat, chosen = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, 1)
        out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for start in range(0, flat.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            scaled = _scaled(flat[rows], temperature)
            lse[rows] = scaled.logsumexp(-1)
            out[rows] = scaled.gather(-1, chosen[rows]).squeeze(-1) - lse[rows]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return out.reshape(targets.shape)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        flat, chosen = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, 1)
        incoming = grad_out.reshape(-1, 1).float()
        grad = torch.empty_like(flat)
        for start in range(0, flat.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            probs = (_scaled(flat[rows], ctx.temperature) - lse[rows].unsqueeze(-1)).exp_()
            chunk = probs.mul_(-incoming[rows]).scatter_add_(-1, chosen[rows], incoming[rows])
            if ctx.temperature != 1.0:
                chunk.div_(ctx.temperature)
            grad[rows] = chunk
        return grad.reshape(logits.shape), None, None, None


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
