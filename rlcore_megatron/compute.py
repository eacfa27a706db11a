"""Running batches through a Megatron model: who computes which rows, micro-batches, the pipeline
schedule, and response log-probs / values from its outputs.

The worker group hands every rank a share of the batch, as if every rank were data parallel; an
update's shares are equal over the data-parallel groups, not necessarily over the ranks. Under tensor,
pipeline or context parallelism the ranks of one model replica (TP x CP x PP ranks) must compute the
same rows, so they first put their shares together (``share_within_model_parallel``): that union is
exactly the replica's data-parallel share. Each rank then returns the rows it was given.
Under context parallelism each rank feeds the model its chunks of every row
(``rlcore_megatron.context_parallel``) and the per-token outputs are summed over the CP ranks.

Rows arrive left-padded (prompt) and right-padded (response). Megatron's RoPE numbers positions
0, 1, ... along the row, so each row is shifted left to start at its first real token
(``aligned``): positions then equal the Hugging Face ``position_ids``, and causal attention alone
keeps every real token from seeing padding (which now only follows it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import attrs
import torch
import torch.distributed as dist
from torch import Tensor

from rlcore.api import Batch, RlcoreError, loss_weights, to_device
from rlcore_megatron.context_parallel import gather_positions, padded_length, split_sequence
from rlcore_megatron.model import Layout, model_replica_group

# on_output(micro_index, micro, model_output) -> (loss, reduced values), run on the last stage
OnOutput = Callable[[int, "Micro", Tensor], tuple[Tensor, dict]]


@attrs.frozen
class Micro:
    """One micro-batch on the CPU, rows shifted to start at their first real token."""

    input_ids: Tensor  # (b, L)
    predictors: Tensor  # (b, R): position of the output that predicts each response token
    responses: Tensor  # (b, R)
    extras: dict[str, Tensor]  # other (b, R) columns the loss needs
    rows: Tensor  # (b,) positions of these rows in the batch they came from
    # (b, L, MoE layers, K) the experts to route each token to (< 0: the router's choice), for router replay
    routed_experts: Tensor | None = None


def alignment(mask: Tensor) -> tuple[Tensor, Tensor]:
    """(B,) each row's first real token (left padding) and (B,) its number of real tokens."""
    return mask.int().argmax(1), mask.sum(1)


def aligned(batch: Batch) -> tuple[Tensor, Tensor]:
    """(input_ids (B, L), predictors (B, R)): each row's real tokens moved to the front (L = the
    longest row's real length), and the index of the output predicting each response token."""
    mask = batch["attention_mask"].bool()  # (B, T)
    width, response_width = mask.shape[1], batch["responses"].shape[1]
    starts, _ = alignment(mask)
    length = max(int(mask.sum(1).max()), 1)
    index = (starts[:, None] + torch.arange(length)).clamp(max=width - 1)
    input_ids = batch["input_ids"].gather(1, index)
    # response token j sits at width - R + j before the shift; the output one before predicts it
    predictors = (width - response_width - 1 + torch.arange(response_width))[None] - starts[:, None]
    return input_ids, predictors.clamp(0, length - 1)


def share_within_model_parallel(batch: Batch, keys: Sequence[str], device: torch.device) -> tuple[Batch, slice]:
    """The union of the model replica's shares (in group-rank order) and where this rank's own rows
    are in it. Shares may differ in length (an update's batch divides over the data-parallel groups,
    not over every rank: ``MegatronBackend.data_parallel_ranks``); rows keep their width."""
    group = model_replica_group()
    size, me, rows = dist.get_world_size(group), dist.get_rank(group), len(batch)
    if size == 1:
        return Batch({key: batch[key] for key in keys}), slice(0, rows)
    counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(size)]
    dist.all_gather(counts, torch.tensor([rows], device=device), group=group)
    counts = [int(count) for count in counts]
    longest, tensors = max(counts), {}
    for key in keys:
        local = to_device(batch[key], device)
        padded = local.new_zeros((longest, *local.shape[1:]))  # all_gather takes equal shapes
        padded[:rows] = local
        parts = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(parts, padded, group=group)
        tensors[key] = torch.cat([part[:count] for part, count in zip(parts, counts)]).cpu()
    start = sum(counts[:me])
    return Batch(tensors), slice(start, start + rows)


def plan_micro_batches(batch: Batch, micro_rows: int | None, token_budget: int | None, budget_name: str
                       ) -> list[Tensor]:
    """Row indices of each micro-batch: ``micro_rows`` rows in order; or, given a ``token_budget``,
    rows sorted by length and packed while rows x longest row fits it; or the whole batch."""
    rows = len(batch)
    if token_budget is None:
        size = micro_rows or max(rows, 1)
        return [torch.arange(start, min(start + size, rows)) for start in range(0, rows, size)]
    lengths = batch["attention_mask"].sum(1)
    if rows and int(lengths.max()) > token_budget:
        raise RlcoreError(f"a sample of {int(lengths.max())} tokens does not fit {budget_name} = {token_budget}: "
                          "raise it to at least prompt + response length")
    groups: list[list[int]] = []
    for index in torch.argsort(lengths, descending=True, stable=True).tolist():
        # sorted longest first, so a group's first row is its longest
        if groups and (len(groups[-1]) + 1) * int(lengths[groups[-1][0]]) <= token_budget:
            groups[-1].append(index)
        else:
            groups.append([index])
    return [torch.tensor(sorted(group), dtype=torch.long) for group in groups]


def micro_batches(batch: Batch, plan: list[Tensor], extra_keys: Sequence[str]) -> list[Micro]:
    """The micro-batches of ``plan``; a ``routed_experts`` column in ``batch`` is aligned as the tokens are."""
    micros = []
    for rows in plan:
        part = batch.select(rows)
        input_ids, predictors = aligned(part)
        extras = {key: part[key] for key in extra_keys if key != "routed_experts"}
        routed = aligned_routing(part) if "routed_experts" in part else None
        micros.append(Micro(input_ids, predictors, part["responses"], extras, rows, routed))
    return micros


def aligned_routing(batch: Batch) -> Tensor:
    """(B, P+R, L, K) routed_experts -> (B, L', L, K) int64 along the aligned rows (L' as ``aligned``'s),
    -1 past each row's real tokens."""
    mask = batch["attention_mask"].bool()
    starts, lengths = alignment(mask)
    length = max(int(lengths.max()), 1)
    offsets = torch.arange(length)
    index = (starts[:, None] + offsets).clamp(max=mask.shape[1] - 1)
    column = batch["routed_experts"].long()
    picked = column[torch.arange(len(column))[:, None], index]  # (B, L', L, K)
    return picked.masked_fill(~(offsets[None] < lengths[:, None])[..., None, None], -1)


def attention_mask(length: int, device: torch.device, sliding_window: int | None = None) -> Tensor:
    """(1, 1, L, L) bool, True where a query may not see a key: every later position, and with a
    ``sliding_window`` of W every position W or more before it (transformers' sliding-window mask:
    query i sees keys i - W + 1 .. i)."""
    positions = torch.arange(length, device=device)
    distance = positions[:, None] - positions[None, :]  # query - key
    hidden = distance < 0
    if sliding_window is not None:
        hidden |= distance >= sliding_window
    return hidden[None, None]


def run_schedule(model: torch.nn.Module, micros: list[Micro], on_output: OnOutput, device: torch.device, *,
                 forward_only: bool, routing=None, sliding_window: int | None = None) -> list[dict]:
    """Every micro-batch through the model with Megatron's schedule for its pipeline layout (1F1B
    across stages, or a plain loop); backward too unless ``forward_only``. Returns what
    ``on_output`` reduced for each micro-batch, in order, on the last stage (empty elsewhere).
    ``routing`` (a ``rlcore_megatron.routing.RoutingPass``) is fed each micro-batch before its forward;
    ``sliding_window``: the model's (``ModelShape.sliding_window``), in the attention mask."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    cp, cp_rank = ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()

    def forward_step(data_iterator, module):
        index, micro = next(data_iterator)
        input_ids = to_device(padded_to_context_chunks(micro.input_ids, cp), device)
        length = input_ids.shape[1]
        positions = torch.arange(length, device=device).expand_as(input_ids)
        if routing is not None:
            routing.feed(micro, length, device)
        if cp > 1:  # this rank's chunks; megatron-core's RoPE picks their positions, rlcore's attention is causal
            input_ids, positions = (split_sequence(tensor, cp, cp_rank) for tensor in (input_ids, positions))
            causal = None
        else:
            causal = attention_mask(length, device, sliding_window)
        output = module(input_ids=input_ids, position_ids=positions, attention_mask=causal)
        return output, functools.partial(on_output, index, micro)

    schedule = get_forward_backward_func()
    # the full (padded) length: megatron-core's schedule divides it by the context-parallel size
    seq_length = max(padded_to_context_chunks(m.input_ids, cp).shape[1] for m in micros)
    with torch.set_grad_enabled(not forward_only):
        # megatron-core multiplies each micro-batch's loss by the CP size, and its DDP averages
        # gradients over data x context parallel ranks: each CP rank's share of the gradient counts once
        return schedule(forward_step_func=forward_step, data_iterator=iter(list(enumerate(micros))), model=[model],
                        num_microbatches=len(micros), seq_length=seq_length,
                        micro_batch_size=max(m.input_ids.shape[0] for m in micros), forward_only=forward_only)


def padded_to_context_chunks(input_ids: Tensor, context_parallel: int) -> Tensor:
    """(b, L) -> (b, L') with L' a multiple of 2 x cp (unchanged at cp 1): padding appended, which the
    causal attention keeps every real token from seeing."""
    if context_parallel == 1:
        return input_ids
    width = padded_length(input_ids.shape[1], context_parallel)
    return torch.nn.functional.pad(input_ids, (0, width - input_ids.shape[1]))


def _last_stage_rank(layout: Layout) -> int:
    from megatron.core import parallel_state as ps

    return dist.get_global_rank(ps.get_pipeline_model_parallel_group(), layout.pipeline_parallel - 1)


def from_last_stage(values: dict[str, Tensor] | None, shapes: dict[str, tuple[int, ...]], layout: Layout,
                    device: torch.device) -> dict[str, Tensor]:
    """fp32 tensors the last pipeline stage computed, on every stage (on the CPU)."""
    if layout.pipeline_parallel == 1:
        return {key: value.cpu() for key, value in values.items()}
    from megatron.core import parallel_state as ps

    result = {}
    for key, shape in shapes.items():
        tensor = values[key].to(device, torch.float32) if layout.last_stage else \
            torch.empty(shape, dtype=torch.float32, device=device)
        dist.broadcast(tensor, src=_last_stage_rank(layout), group=ps.get_pipeline_model_parallel_group())
        result[key] = tensor.cpu()
    return result


def object_from_last_stage(value, layout: Layout):
    if layout.pipeline_parallel == 1:
        return value
    from megatron.core import parallel_state as ps

    box = [value if layout.last_stage else None]
    dist.broadcast_object_list(box, src=_last_stage_rank(layout), group=ps.get_pipeline_model_parallel_group())
    return box[0]


def data_parallel_sum(value: float, device: torch.device) -> float:
    from megatron.core import parallel_state as ps

    if ps.get_data_parallel_world_size() == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(total, group=ps.get_data_parallel_group())
    return float(total.item())


def micro_weights(micros: list[Micro], loss_agg_mode: str, data_parallel: int, device: torch.device) -> list[float]:
    """Per micro-batch factors for its loss (``rlcore.api.loss_weights``; Megatron's DDP averages
    gradients over the data-parallel ranks)."""
    global_sum = (lambda count: data_parallel_sum(count, device)) if data_parallel > 1 else float
    return loss_weights([m.extras["response_mask"] for m in micros], loss_agg_mode, data_parallel, global_sum)


# -- outputs -> per-token values ----------------------------------------------------------------------
def response_logits(logits: Tensor, micro: Micro, vocab_size: int) -> Tensor:
    """(b, L, V/tp) vocab-parallel logits -> (b, R, V) fp32 logits of the positions predicting each
    response token, gathered over the tensor-parallel ranks (gradients flow back to each share),
    the padded vocabulary cut off."""
    from megatron.core import tensor_parallel

    picked = at_predictors(logits, micro)  # (b, R, V/tp)
    full = tensor_parallel.gather_from_tensor_model_parallel_region(picked)
    return full[..., :vocab_size].float()


def response_values(values: Tensor, micro: Micro) -> Tensor:
    """(b, L, 1) value-head outputs -> (b, R) fp32: the value of the state before each response token."""
    return at_predictors(values, micro)[..., 0].float()


def at_predictors(outputs: Tensor, micro: Micro) -> Tensor:
    """(b, L, ...) per-token outputs -> (b, R, ...) at the positions predicting each response token;
    under context parallelism ``outputs`` are this rank's (b, L / cp, ...) tokens and every CP rank
    gets the (b, R, ...) values of all of them."""
    from megatron.core import parallel_state as ps

    index = micro.predictors.to(outputs.device)
    cp = ps.get_context_parallel_world_size()
    if cp > 1:
        return gather_positions(outputs, index, outputs.shape[1] * cp, ps.get_context_parallel_group())
    return outputs.gather(1, index.reshape(*index.shape, *([1] * (outputs.dim() - 2))).expand(
        *index.shape, *outputs.shape[2:]))
