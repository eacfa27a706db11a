"""``agg_loss``: how a (B, T) matrix of per-token losses becomes the scalar that is backpropagated."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from rlcore.algorithms.masked import as_mask, masked_mean, masked_sum

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(loss_mat: Tensor, loss_mask: Tensor, loss_agg_mode: str, *, norm_length: int | None = None) -> Tensor:
    """Aggregate per-token losses (B, T) under a mask (B, T) into a scalar, in fp32.

    - ``token-mean``: mean over all response tokens of the batch (verl's default).
    - ``seq-mean-token-sum``: sum over each sequence's tokens, mean over sequences.
    - ``seq-mean-token-mean``: mean over each sequence's tokens, mean over sequences.
    - ``seq-mean-token-sum-norm``: sum over each sequence's tokens, mean over sequences, divided by
      ``norm_length`` (Dr.GRPO's constant normaliser, so long and short answers weigh per token alike),
      as verl 0.9.1's ``agg_loss``: sum_i sum_t loss_it / (sequences * norm_length). ``norm_length``
      (verl's ``loss_scale_factor``) defaults to the tensor's width; the backends pass
      ``data.max_response_length``.

    Sequence means count only sequences with at least one token, so all-padding rows change nothing.
    """
    mask = as_mask(loss_mask)
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, mask)
    seq_sums = masked_sum(loss_mat, mask, dim=-1)  # (B,)
    seq_lengths = mask.float().sum(-1)  # (B,)
    has_tokens = seq_lengths > 0  # (B,)
    if loss_agg_mode == "seq-mean-token-sum":
        return masked_mean(seq_sums, has_tokens)
    if loss_agg_mode == "seq-mean-token-mean":
        return masked_mean(seq_sums / seq_lengths.clamp(min=1.0), has_tokens)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return masked_mean(seq_sums, has_tokens) / float(norm_length if norm_length is not None else loss_mat.shape[-1])
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; known: {', '.join(LOSS_AGG_MODES)}")


def loss_weights(response_masks: Sequence[Tensor | None], loss_agg_mode: str, replicas: int,
                 global_sum: Callable[[float], float] = float) -> list[float]:
    """Per micro-batch factors that make the sum of this rank's micro-batch losses, over every
    data-parallel rank, the loss of the whole mini-batch for ``loss_agg_mode``: each micro-batch's share
    of the mini-batch's response tokens (``token-mean``) or of its sequences with tokens (the
    ``seq-mean-*`` modes; ``seq-mean-token-sum-norm`` too, which verl 0.9.1 divides by the mini-batch's
    sequence count as well as by the length), times ``replicas`` (the backend averages gradients over
    its data-parallel ranks). A filler micro-batch (mask None: a rank with fewer micro-batches runs
    empty ones to stay in step) weighs 0. ``global_sum`` adds a count over the data-parallel ranks."""
    counts = [0.0 if mask is None else float(mask.bool().sum() if loss_agg_mode == "token-mean"
                                             else mask.bool().any(-1).sum())
              for mask in response_masks]
    total = global_sum(sum(counts))
    return [replicas * count / total if total else 0.0 for count in counts]
