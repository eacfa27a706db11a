"""Context parallelism without TransformerEngine: every sequence split over the context-parallel
(CP) ranks, attention computed Ulysses-style.

megatron-core splits a sequence of length L (a multiple of 2 x cp) into 2 x cp chunks and gives CP
rank r chunks r and 2 x cp - 1 - r (a causal mask then costs every rank the same); its rotary
embedding takes each rank's positions so (``get_pos_emb_on_this_cp_rank``). rlcore splits its
inputs the same way (``local_positions``), so megatron-core's RoPE, layers and loss scaling work
unchanged; only the core attention needs the whole sequence. ``ulysses_attention_class()`` takes the place
of the local spec's ``DotProductAttention``: an all-to-all turns this rank's (s/cp tokens, all
heads) into (all s tokens, heads/cp), the tokens are put back in sequence order for causal attention,
and a second all-to-all returns (s/cp tokens, all heads).

The pure functions here (positions, reorderings) are what the tests check without a GPU.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from rlcore.api import all_to_all


# -- where each token lives -----------------------------------------------------------------------
def padded_length(length: int, context_parallel: int) -> int:
    """``length`` rounded up to a multiple of 2 x cp, the chunks megatron-core's split needs."""
    chunk = 2 * context_parallel
    return math.ceil(length / chunk) * chunk


def local_positions(length: int, context_parallel: int, rank: int) -> Tensor:
    """(length / cp,) the sequence positions CP rank ``rank`` holds, in its order: chunk ``rank``
    then chunk 2 x cp - 1 - ``rank`` of 2 x cp (megatron-core's ``get_batch_on_this_cp_rank``)."""
    chunks = 2 * context_parallel
    if length % chunks:
        raise ValueError(f"a sequence of {length} tokens does not split into {chunks} equal chunks "
                         f"(context parallel {context_parallel})")
    size = length // chunks
    first, second = rank, chunks - 1 - rank
    return torch.cat([torch.arange(first * size, (first + 1) * size),
                      torch.arange(second * size, (second + 1) * size)])


def gathered_positions(length: int, context_parallel: int) -> Tensor:
    """(length,) the sequence position of each token after the all-to-all: rank 0's tokens, then
    rank 1's, ..., each rank's in its own order."""
    return torch.cat([local_positions(length, context_parallel, rank) for rank in range(context_parallel)])


def split_sequence(tensor: Tensor, context_parallel: int, rank: int, dim: int = 1) -> Tensor:
    """This CP rank's tokens of ``tensor`` along ``dim`` (its length a multiple of 2 x cp)."""
    if context_parallel == 1:
        return tensor
    index = local_positions(tensor.shape[dim], context_parallel, rank).to(tensor.device)
    return tensor.index_select(dim, index)


def owned_positions(positions: Tensor, length: int, context_parallel: int, rank: int) -> tuple[Tensor, Tensor]:
    """For sequence ``positions`` (any shape, values < ``length``): whether CP rank ``rank`` holds
    each one, and its offset in that rank's tokens (0 where it does not)."""
    local = local_positions(length, context_parallel, rank)
    offset_of = torch.full((length,), -1, dtype=torch.long)
    offset_of[local] = torch.arange(len(local))
    offsets = offset_of[positions.cpu()]
    owned = offsets >= 0
    return owned.to(positions.device), offsets.clamp(min=0).to(positions.device)


# -- communication with gradients (the all-to-all is rlcore.api's) ---------------------------------
class _SumOverRanks(torch.autograd.Function):
    """Sum over the group forward; backward the gradient unchanged: every rank then computes the
    same loss from the sum, and each rank's own addend gets that loss's gradient once."""

    @staticmethod
    def forward(ctx, tensor: Tensor, group) -> Tensor:
        total = tensor.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


def sum_over_ranks(tensor: Tensor, group) -> Tensor:
    return _SumOverRanks.apply(tensor, group)


def gather_positions(local: Tensor, positions: Tensor, length: int, group) -> Tensor:
    """(b, n, ...) values at sequence ``positions`` (b, n) from this CP rank's (b, length / cp, ...)
    ``local`` values, summed with the other ranks' (each position held by one rank): every rank gets
    them all, and gradients reach the rank holding each position."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    owned, offsets = owned_positions(positions, length, cp, rank)
    index = offsets.reshape(*offsets.shape, *([1] * (local.dim() - 2))).expand(*offsets.shape, *local.shape[2:])
    picked = local.gather(1, index)
    mask = owned.reshape(*owned.shape, *([1] * (local.dim() - 2))).to(picked.dtype)
    return sum_over_ranks(picked * mask, group)


# -- the core attention ------------------------------------------------------------------------------
def ulysses_attention_class():
    """The core-attention module class for the local layer spec under context parallelism (built on
    first use, so this module imports without megatron-core)."""
    global _ULYSSES
    if _ULYSSES is None:
        _ULYSSES = _build_ulysses_class()
    return _ULYSSES


_ULYSSES = None


def _build_ulysses_class():
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.module import MegatronModule

    class Ulysses(MegatronModule):
        """Causal attention over the whole sequence for this rank's share of the heads, with the
        tokens split over the CP ranks before and after (called as ``DotProductAttention``)."""

        def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                     attention_dropout: float | None = None, softmax_scale: float | None = None,
                     cp_comm_type: str | None = None, pg_collection=None):
            super().__init__(config=config)
            if attn_mask_type != AttnMaskType.causal:
                raise ValueError(f"rlcore's context-parallel attention is causal only, not {attn_mask_type}")
            self.group = pg_collection.cp if pg_collection is not None and hasattr(pg_collection, "cp") \
                else ps.get_context_parallel_group()
            head_dim = config.kv_channels
            self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
            self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

        def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask, attn_mask_type=None,
                    attention_bias=None, packed_seq_params=None) -> Tensor:
            if packed_seq_params is not None or attention_bias is not None:
                raise ValueError("rlcore's context-parallel attention takes no packed sequences or attention bias")
            return ulysses_attention(query, key, value, self.group, self.softmax_scale,
                                     self.dropout if self.training else 0.0)

    return Ulysses


def ulysses_attention(query: Tensor, key: Tensor, value: Tensor, group, scale: float, dropout: float = 0.0) -> Tensor:
    """(s/cp, b, heads, d) queries and (s/cp, b, groups, d) keys and values of this CP rank's tokens
    -> (s/cp, b, heads x d): causal attention over the whole sequence, each rank computing heads / cp
    of the heads (and groups / cp of the key/value groups) between two all-to-alls. Fewer groups than
    ranks (cp a multiple of groups) are repeated first, so that each rank gets the group its heads use."""
    cp = dist.get_world_size(group)
    length = query.shape[0] * cp
    if key.shape[2] < cp:
        key, value = (t.repeat_interleave(cp // key.shape[2], dim=2) for t in (key, value))
    # (s/cp, b, heads, d) -> (s, b, heads/cp, d), the tokens in the exchange's order
    query, key, value = (all_to_all(t, 2, 0, group) for t in (query, key, value))
    gathered = gathered_positions(length, cp).to(query.device)
    natural = torch.argsort(gathered)  # natural[p]: where position p sits after the exchange
    query, key, value = (t.index_select(0, natural) for t in (query, key, value))
    context = causal_attention(query, key, value, scale, dropout)  # (s, b, heads/cp, d), in sequence order
    context = context.index_select(0, gathered)  # back to the exchange's order
    context = all_to_all(context, 0, 2, group)  # (s/cp, b, heads, d)
    return context.reshape(context.shape[0], context.shape[1], -1)


def causal_attention(query: Tensor, key: Tensor, value: Tensor, scale: float, dropout: float) -> Tensor:
    """(s, b, heads, d) queries, (s, b, groups, d) keys and values -> (s, b, heads, d), each query
    seeing itself and the tokens before it; key/value groups shared by heads / groups heads."""
    repeat = query.shape[2] // key.shape[2]
    if repeat > 1:
        key, value = key.repeat_interleave(repeat, dim=2), value.repeat_interleave(repeat, dim=2)
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # (b, heads, s, d)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale)
    return out.permute(2, 0, 1, 3)
