"""Per-token entropy of the policy, for the entropy bonus (``actor.entropy_coeff``) and its metric."""

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
