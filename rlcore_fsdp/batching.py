"""How a worker's share of a batch becomes optimizer steps: epochs x mini-batches x micro-batches.

Each micro-batch's loss is the loss function applied to that micro-batch alone; ``micro_weights``
gives the factors that make their sum equal the loss of the whole mini-batch (over all ranks) for
the ``loss_agg_mode`` in use, so gradient accumulation changes nothing but memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore_fsdp.distributed import world_size


def rows_per_mini_batch(prompts_per_mini_batch: int, n: int, section: str) -> int:
    """Rows of one mini-batch on one worker: prompts x n samples, split over the ranks."""
    rows, ranks = prompts_per_mini_batch * n, world_size()
    if rows % ranks:
        raise RlcoreError(f"{section}.ppo_mini_batch_size x rollout.n = {rows} samples do not split "
                          f"evenly over {ranks} workers")
    return rows // ranks


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


def micro_batches(mini: Batch, micro_rows: int | None, token_budget: int | None) -> list[Batch]:
    """``micro_rows`` rows each; or, given a ``token_budget``, as many padded rows as fit in it;
    or the whole mini-batch."""
    if token_budget is not None:
        micro_rows = max(1, token_budget // mini["input_ids"].shape[1])
    return mini.split(micro_rows) if micro_rows else [mini]


def _global_sum(value: float) -> float:
    if world_size() == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(total)
    return float(total.item())


def micro_weights(micros: list[Batch], loss_agg_mode: str) -> list[float]:
    """Per micro-batch factors for its loss: its share of the mini-batch's tokens (``token-mean``) or
    sequences (``seq-mean-*``), times the rank count since FSDP averages gradients over ranks.
    ``seq-mean-token-sum-norm`` divides by a constant, so its micro-batch losses simply add up."""
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return [float(world_size())] * len(micros)
    if loss_agg_mode == "token-mean":
        counts = [float(m["response_mask"].bool().sum()) for m in micros]
    else:
        counts = [float(m["response_mask"].bool().any(-1).sum()) for m in micros]
    total = _global_sum(sum(counts))
    return [world_size() * c / total if total else 0.0 for c in counts]


def require(batch: Batch, keys: tuple[str, ...], what: str) -> None:
    missing = [k for k in keys if k not in batch]
    if missing:
        raise RlcoreError(f"{what} needs batch keys {', '.join(missing)}; the batch has {', '.join(batch.tensors)}")
