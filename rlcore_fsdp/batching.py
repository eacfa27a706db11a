"""How a worker's share of a batch becomes optimizer steps: epochs x mini-batches x micro-batches.

Micro-batches are a fixed number of rows, or (dynamic batch size, verl's ``use_dynamic_bsz``) as
many samples as fit a token budget: a sample costs its real tokens when rows are packed, the padded
width otherwise. Every rank runs the same number of micro-batches (FSDP's collectives pair up
forward for forward), the most any rank needs, and spreads its samples over them so their token
counts are as even as it can make them; a rank with fewer samples than micro-batches runs fillers
whose loss is weighted 0.

Each micro-batch's loss is the loss function applied to that micro-batch alone; ``micro_weights``
gives the factors that make their sum equal the loss of the whole mini-batch (over all ranks) for
the ``loss_agg_mode`` in use, so the way a mini-batch is cut changes nothing but memory and speed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

import attrs
import torch
import torch.distributed as dist

from rlcore.api import Batch, RlcoreError, loss_weights, world_size


@attrs.frozen
class MicroBatch:
    batch: Batch
    rows: torch.Tensor  # (b,) positions of its rows in the mini-batch; empty for a filler

    @property
    def is_filler(self) -> bool:
        return self.rows.numel() == 0


def mini_batches(batch: Batch, rows: int, epochs: int, shuffle: bool, seed: int) -> Iterator[Batch]:
    """``epochs`` passes over ``batch`` in mini-batches of ``rows`` rows (the last may be smaller),
    in a fresh random order each epoch when ``shuffle``."""
    for epoch in range(epochs):
        if shuffle:
            generator = torch.Generator().manual_seed(seed * 1000 + epoch)
            batch_order = batch.select(torch.randperm(len(batch), generator=generator))
        else:
            batch_order = batch
        yield from batch_order.split(rows)


def token_costs(batch: Batch, packed: bool) -> list[int]:
    """What each row costs a forward: its real tokens when packed, the padded width otherwise."""
    mask = batch["attention_mask"]
    return mask.sum(-1).tolist() if packed else [mask.shape[1]] * mask.shape[0]


def balanced_partition(costs: list[int], parts: int) -> list[list[int]]:
    """Row indices in ``parts`` groups of near-equal total cost: largest first, each to the lightest
    group so far (LPT); each group in its original order."""
    heap = [(0, group) for group in range(parts)]
    groups: list[list[int]] = [[] for _ in range(parts)]
    for index in sorted(range(len(costs)), key=lambda i: -costs[i]):
        load, group = heapq.heappop(heap)
        groups[group].append(index)
        heapq.heappush(heap, (load + costs[index], group))
    return [sorted(group) for group in groups]


def _global_max(value: int) -> int:
    if world_size() == 1:
        return value
    total = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    return int(total.item())


def _parts_within(costs: list[int], budget: int, what: str) -> int:
    """The fewest groups whose balanced partition keeps every group within ``budget``."""
    if not costs:
        return 0
    if max(costs) > budget:
        raise RlcoreError(f"a sample of {max(costs)} tokens does not fit {what} = {budget}: raise it to at "
                          "least prompt + response length")
    parts = math.ceil(sum(costs) / budget)
    while max(sum(costs[i] for i in group) for group in balanced_partition(costs, parts)) > budget:
        parts += 1
    return parts


def micro_batches(mini: Batch, micro_rows: int | None, token_budget: int | None, *, packed: bool = False,
                  budget_name: str = "the token budget") -> list[MicroBatch]:
    """``micro_rows`` rows each (in order); or, given a ``token_budget``, balanced groups within it,
    as many on every rank; or the whole mini-batch."""
    if token_budget is None:
        size = micro_rows or max(len(mini), 1)
        return [MicroBatch(mini.select(range(start, min(start + size, len(mini)))),
                           torch.arange(start, min(start + size, len(mini))))
                for start in range(0, len(mini), size)]
    costs = token_costs(mini, packed)
    parts = _global_max(_parts_within(costs, token_budget, budget_name))
    micros = []
    for group in balanced_partition(costs, parts):
        if group:
            micros.append(MicroBatch(mini.select(group), torch.tensor(group, dtype=torch.long)))
        else:
            micros.append(MicroBatch(mini.select([0]), torch.zeros(0, dtype=torch.long)))
    return micros


def _global_sum(value: float) -> float:
    if world_size() == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(total)
    return float(total.item())


def micro_weights(micros: list[MicroBatch], loss_agg_mode: str) -> list[float]:
    """Per micro-batch factors for its loss (``rlcore.api.loss_weights``; FSDP averages gradients
    over every rank, and a filler weighs 0)."""
    return loss_weights([None if m.is_filler else m.batch["response_mask"] for m in micros], loss_agg_mode,
                        world_size(), _global_sum)


def require(batch: Batch, keys: tuple[str, ...], what: str) -> None:
    missing = [k for k in keys if k not in batch]
    if missing:
        raise RlcoreError(f"{what} needs batch keys {', '.join(missing)}; the batch has {', '.join(batch.tensors)}")
