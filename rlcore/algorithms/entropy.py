"""Per-token log-probs and entropy of the policy from its logits: what every training backend
computes for the old log-probs, the reference, the loss, the entropy bonus (``actor.entropy_coeff``)
and its metric."""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_from_logits(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Entropy of softmax(logits) over the last dim: (..., V) -> (...), in fp32.

    ``chunk_size`` rows (of the flattened leading dims) at a time bounds the fp32 copy of the logits,
    which for a 150k vocabulary is the largest tensor of the step.
    """
    flat = logits.reshape(-1, logits.shape[-1])  # (N, V)
    step = chunk_size or max(flat.shape[0], 1)
    parts = []
    for start in range(0, flat.shape[0], step):
        chunk = flat[start:start + step].float()
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
    keeps its graph only with ``entropy_grad`` (an entropy bonus); else it is a metric."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach(), chunk_size=ENTROPY_CHUNK_ROWS)
    return log_probs, entropy


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
