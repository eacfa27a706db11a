"""``agg_loss``: how a (B, T) matrix of per-token losses becomes the scalar that is backpropagated."""

from __future__ import annotations

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
