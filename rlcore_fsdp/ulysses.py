"""Ulysses sequence parallelism (DeepSpeed-Ulysses; verl's ``ulysses_sequence_parallel_size``).

The ranks of a sequence-parallel (SP) group, ``size`` consecutive ranks, work on the same rows: at
the start of a pass they pool their shares (``share_rows``), and each micro-batch of the pool is
packed into one row (``model.use_remove_padding``) that is cut into ``size`` equal pieces, one per
rank. Every layer runs on the rank's piece, except attention: an all-to-all before it trades the
sequence for heads (each rank then holds the whole row for 1/size of the heads), another after it
trades them back. The values at response tokens (log-probs, entropy, values) are gathered, so each
rank of the group holds the micro-batch's whole output and computes the same loss from it.

Gradients: the gather's backward sums the gradient over the group (every rank's loss reads every
piece) and keeps the rank's own piece; FSDP then averages over all ranks. Because the loss weights
(``batching.micro_weights``) count each pooled row once per rank of its group, the two factors of
``size`` cancel, and the step equals the one data-parallel ranks would take over the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from rlcore.api import (
    Batch,
    MicroBatchPlan,
    Platform,
    RlcoreError,
    StudentTopK,
    all_to_all,
    student_top_k,
    sum_pi_squared_from_logits,
    token_log_probs,
    top_k_log_probs,
)
from rlcore_fsdp.attention import packed_attention_forward, register, use_masked_kernels, use_packed_attention
from rlcore_fsdp.packing import PackedRows

NAME = "rlcore_ulysses"
GROUP_KWARG = "sequence_parallel_group"  # how a forward hands the group to the attention of each layer
_groups: dict[int, dist.ProcessGroup] = {}


def sequence_parallel_group(size: int, setting: str) -> dist.ProcessGroup | None:
    """This rank's SP group of ``size`` consecutive ranks (None for 1). Every rank must call it
    (creating groups is collective)."""
    if size == 1:
        return None
    world = dist.get_world_size()
    if world % size:
        raise RlcoreError(f"{setting} = {size} does not divide the {world} training ranks into whole groups")
    if size not in _groups:
        rank = dist.get_rank()
        for start in range(0, world, size):
            group = dist.new_group(list(range(start, start + size)))
            if start <= rank < start + size:
                _groups[size] = group
    return _groups[size]


# -- collectives with gradients (the all-to-all is rlcore.api's) --------------------------------------
class _GatherPieces(torch.autograd.Function):
    """(n_r, ...) values of each rank -> all of them (N, ...) in rank order, on every rank. Backward: the
    gradient summed over the group (each rank's loss reads all of them), this rank's piece of it."""

    @staticmethod
    def forward(ctx, local: Tensor, sizes: list[int], group: dist.ProcessGroup) -> Tensor:
        rank = dist.get_rank(group)
        ctx.piece, ctx.group = (sum(sizes[:rank]), sizes[rank]), group
        longest = max(sizes)
        padded = F.pad(local, (0, 0) * (local.dim() - 1) + (0, longest - local.shape[0])).contiguous()
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)])

    @staticmethod
    def backward(ctx, grad: Tensor):
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        start, length = ctx.piece
        return total[start:start + length], None, None


# -- attention -------------------------------------------------------------------------------------
def ulysses_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                              attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                              sliding_window: int | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention-function signature. Given a group (``GROUP_KWARG``) and a packed
    row: (1, H, T/size, D) pieces in, all-to-all to (1, H/size, T, D), packed attention, all-to-all
    back to (1, T/size, H, D). Otherwise it is ``rlcore_packed`` (generation, one rank)."""
    group = kwargs.pop(GROUP_KWARG, None)
    if group is None or kwargs.get("cu_seq_lens_q") is None:
        return packed_attention_forward(module, query, key, value, attention_mask, dropout, scaling,
                                        sliding_window, **kwargs)
    size = dist.get_world_size(group)
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % size:
        raise RlcoreError(f"the model's {heads} attention heads do not split over ulysses_sequence_parallel_size "
                          f"= {size} ranks: choose a size that divides {heads}")
    if kv_heads % size:  # fewer key/value heads than ranks: each rank takes copies of the ones its heads use
        key, value = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (key, value))
    query, key, value = (all_to_all(x, 1, 2, group) for x in (query, key, value))  # (1, H/size, T, D)
    out, _ = packed_attention_forward(module, query, key, value, None, dropout, scaling, sliding_window, **kwargs)
    return all_to_all(out, 1, 2, group), None  # (1, T, H/size, D) -> (1, T/size, H, D)


def use_ulysses_attention(model: nn.Module) -> None:
    """Switch a transformers model to ``rlcore_ulysses`` (packed attention that splits sequences
    when a forward passes a group)."""
    register(NAME, ulysses_attention_forward)
    use_packed_attention(model, NAME)


def packed_attention(model: nn.Module, packed: bool, sp_group: dist.ProcessGroup | None, section: str,
                     platform: Platform) -> None:
    """Packed rows use ``rlcore_packed`` attention; split over an SP group, ``rlcore_ulysses``. Padded
    rows under transformers' SDPA use ``rlcore_packed`` too, whose padded path is that SDPA with finite
    gradients on ``platform`` (``rlcore_fsdp.attention``); a model on another attention keeps it."""
    use_masked_kernels(platform.masked_attention_kernels())
    if sp_group is not None and not packed:
        raise RlcoreError(f"{section}.ulysses_sequence_parallel_size > 1 splits packed rows: set "
                          "model.use_remove_padding = true")
    if sp_group is not None:
        use_ulysses_attention(model)
    elif packed or model.config._attn_implementation == "sdpa":
        use_packed_attention(model)


# -- rows and pieces -------------------------------------------------------------------------------
def share_rows(batch: Batch, group: dist.ProcessGroup | None, device: torch.device) -> tuple[Batch, slice]:
    """The pooled rows of the group (its ranks' shares in rank order) and where this rank's own
    rows are in it. Shares are pieces of one padded batch (the same widths); their row counts may differ."""
    rows = len(batch)
    if group is None:
        return batch, slice(0, rows)
    size, me = dist.get_world_size(group), dist.get_rank(group)
    counts = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(size)]
    dist.all_gather(counts, torch.tensor([rows], dtype=torch.int64, device=device), group=group)
    counts = [int(c.item()) for c in counts]
    most = max(counts)
    pooled = {}
    for key, tensor in batch.tensors.items():
        local = tensor.to(device, torch.int32 if tensor.dtype == torch.int16 else tensor.dtype)  # gloo has no int16
        local = torch.cat([local, local.new_zeros((most - rows, *local.shape[1:]))]).contiguous()
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local, group=group)
        pooled[key] = torch.cat([part[:n] for part, n in zip(parts, counts)]).to(tensor.device, tensor.dtype)
    start = sum(counts[:me])
    return Batch(pooled, meta=batch.meta), slice(start, start + rows)


def _local_piece(rows: PackedRows, group: dist.ProcessGroup) -> tuple[dict, Tensor, Tensor, list[int]]:
    """This rank's piece of the packed row: the model's inputs, the piece's positions that predict
    response tokens (local indices), which of ``rows.predictors`` those are, and every rank's count."""
    size, me = dist.get_world_size(group), dist.get_rank(group)
    total = rows.num_tokens
    piece = math.ceil(total / size)
    extra = piece * size - total  # filler tokens at the end: a sample of their own
    input_ids, position_ids = (F.pad(x, (0, extra)) for x in (rows.input_ids, rows.position_ids))
    cu_seqlens = rows.cu_seqlens
    if extra:
        cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_tensor([total + extra])])
    longest = max(rows.max_length, extra)
    start = me * piece
    owner = torch.div(rows.predictors, piece, rounding_mode="floor")  # (N,) the rank holding each
    mine = owner == me
    sizes = torch.bincount(owner, minlength=size).tolist()
    inputs = {
        "input_ids": input_ids[:, start:start + piece], "position_ids": position_ids[:, start:start + piece],
        "attention_mask": torch.ones(1, 1, 1, 1, dtype=torch.bool, device=input_ids.device),
        "cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens, "max_length_q": longest, "max_length_k": longest,
        GROUP_KWARG: group,
    }
    return inputs, rows.predictors[mine] - start, mine, sizes


def log_probs_and_entropy(model: nn.Module, rows: PackedRows, temperature: float, with_entropy: bool,
                          entropy_grad: bool, group: dist.ProcessGroup, *, with_sum_pi_squared: bool = False
                          ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``forward.log_probs_and_entropy`` for a packed micro-batch split over the group: (B, R) on every rank."""
    inputs, predictors, mine, sizes = _local_piece(rows, group)
    logits = model(**inputs, use_cache=False, logits_to_keep=predictors).logits[0]  # (n, V)
    log_probs, entropy = token_log_probs(logits, rows.targets[mine], temperature, with_entropy=with_entropy,
                                         entropy_grad=entropy_grad)
    log_probs = rows.unpack(_GatherPieces.apply(log_probs, sizes, group))
    if entropy is not None:
        entropy = rows.unpack(_GatherPieces.apply(entropy, sizes, group))
    squares = None
    if with_sum_pi_squared:
        with torch.no_grad():
            squares = sum_pi_squared_from_logits(logits.float() / temperature)
        squares = rows.unpack(_GatherPieces.apply(squares, sizes, group))
    return log_probs, entropy, squares


def teacher_log_probs_and_top_k(model: nn.Module, rows: PackedRows, temperature: float, k: int,
                                group: dist.ProcessGroup) -> dict[str, Tensor]:
    """``forward.teacher_log_probs_and_top_k`` for a packed micro-batch split over the group."""
    inputs, predictors, mine, sizes = _local_piece(rows, group)
    logits = model(**inputs, use_cache=False, logits_to_keep=predictors).logits[0]  # (n, V)
    log_probs, _ = token_log_probs(logits, rows.targets[mine], temperature, with_entropy=False)
    top_log_probs, top_ids = top_k_log_probs(logits, k, temperature)  # (n, K) each
    return {key: rows.unpack(_GatherPieces.apply(value, sizes, group)) for key, value in (
        ("ref_log_prob", log_probs), ("ref_topk_ids", top_ids), ("ref_topk_log_probs", top_log_probs))}


def student_log_probs_at_teacher_top_k(model: nn.Module, rows: PackedRows, temperature: float, teacher_ids: Tensor,
                                       entropy_grad: bool, group: dist.ProcessGroup
                                       ) -> tuple[Tensor, Tensor, StudentTopK]:
    """``forward.student_log_probs_at_teacher_top_k`` for a packed micro-batch split over the group;
    ``teacher_ids`` (N, K) packed like the response tokens."""
    inputs, predictors, mine, sizes = _local_piece(rows, group)
    logits = model(**inputs, use_cache=False, logits_to_keep=predictors).logits[0]  # (n, V)
    log_probs, entropy = token_log_probs(logits, rows.targets[mine], temperature, with_entropy=True,
                                         entropy_grad=entropy_grad)
    at_teacher, overlap = student_top_k(logits, teacher_ids[mine], temperature)

    def gathered(values: Tensor) -> Tensor:
        return rows.unpack(_GatherPieces.apply(values, sizes, group))

    return gathered(log_probs), gathered(entropy), StudentTopK(log_probs=gathered(at_teacher),
                                                               overlap=gathered(overlap))


def response_values(model: nn.Module, rows: PackedRows, group: dist.ProcessGroup) -> Tensor:
    """``forward.response_values`` for a packed micro-batch split over the group: (B, R) on every rank."""
    inputs, predictors, _, sizes = _local_piece(rows, group)
    values = model(**inputs, use_cache=False).logits[0, :, 0]  # (T/size,)
    return rows.unpack(_GatherPieces.apply(values[predictors].float(), sizes, group))


# -- passes over a group's pooled rows -------------------------------------------------------------
def group_size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def per_group(plan: MicroBatchPlan, group: dist.ProcessGroup | None) -> MicroBatchPlan:
    """A micro-batch plan for pooled rows: the token budget is per rank, so a group's micro-batch
    holds ``size`` times as many tokens (as verl); a row count is per micro-batch of the group."""
    if plan.token_budget is None or group is None:
        return plan
    return attrs.evolve(plan, token_budget=plan.token_budget * group_size(group))


def local_routing(tokens: Tensor, group: dist.ProcessGroup) -> Tensor:
    """This rank's piece of a packed micro-batch's (N, L, K) routing (router replay), cut as ``_local_piece``
    cuts the packed row; the filler tokens at its end get -1 (their router chooses)."""
    size, me = dist.get_world_size(group), dist.get_rank(group)
    piece = math.ceil(len(tokens) / size)
    filler = tokens.new_full((piece * size - len(tokens), *tokens.shape[1:]), -1)
    return torch.cat([tokens, filler])[me * piece:(me + 1) * piece]


def gathered_routing(piece: Tensor, total: int, group: dist.ProcessGroup) -> Tensor:
    """The (total, L, K) routing of a packed micro-batch from every rank's recorded (piece, L, K)."""
    local = piece.to(torch.int32).contiguous()  # gloo gathers no int16
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local, group=group)
    return torch.cat(parts)[:total].to(piece.dtype)


def over_group(batch: Batch, group: dist.ProcessGroup | None, device: torch.device,
               run: Callable[[Batch], Batch]) -> Batch:
    """``run`` over the group's pooled rows; this rank's own rows of its result."""
    if group is None:
        return run(batch)
    pooled, own = share_rows(batch, group, device)
    return run(pooled).select(range(own.start, own.stop))
