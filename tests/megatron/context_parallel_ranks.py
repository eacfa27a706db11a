"""One rank of the context-parallel attention check, started by ``tests.ranks.run_ranks`` (2 CPU ranks,
gloo) from ``test_context_parallel.py``: every rank draws the same whole sequence, keeps its two chunks
of four (megatron-core's split, written out by hand here), and runs ``ulysses_attention`` (with 2
key/value groups, one per rank, and with 1, which both ranks need) and ``gather_positions`` on them;
rank r saves its outputs and input gradients to argv[1]/rank{r}.pt."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore_megatron.context_parallel import gather_positions, ulysses_attention

LENGTH, BATCH, HEADS, GROUPS, HEAD_DIM, VOCAB = 16, 2, 4, 2, 8, 5


def whole_inputs(groups: int = GROUPS) -> dict[str, torch.Tensor]:
    """The same (s, b, ., d) queries/keys/values, loss weights and (b, s, V) outputs on every rank."""
    g = torch.Generator().manual_seed(groups)
    return {"query": torch.randn(LENGTH, BATCH, HEADS, HEAD_DIM, generator=g),
            "key": torch.randn(LENGTH, BATCH, groups, HEAD_DIM, generator=g),
            "value": torch.randn(LENGTH, BATCH, groups, HEAD_DIM, generator=g),
            "weight": torch.randn(LENGTH, BATCH, HEADS * HEAD_DIM, generator=g),
            "outputs": torch.randn(BATCH, LENGTH, VOCAB, generator=g),
            "positions": torch.tensor([[0, 5, 6, 15, 3], [12, 1, 7, 8, 9]]),
            "pick_weight": torch.randn(BATCH, 5, VOCAB, generator=g)}


def rank_tokens(rank: int) -> torch.Tensor:
    """Rank 0 holds chunks 0 and 3 of 4, rank 1 chunks 1 and 2 (4 tokens each)."""
    return torch.tensor([0, 1, 2, 3, 12, 13, 14, 15]) if rank == 0 else torch.tensor([4, 5, 6, 7, 8, 9, 10, 11])


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, group = dist.get_rank(), dist.group.WORLD
    mine = rank_tokens(rank)
    result = {"tokens": mine}
    for groups in (GROUPS, 1):
        whole = whole_inputs(groups)
        local = {name: whole[name][mine].clone().requires_grad_(True) for name in ("query", "key", "value")}
        context = ulysses_attention(local["query"], local["key"], local["value"], group, scale=HEAD_DIM ** -0.5)
        (context * whole["weight"][mine]).sum().backward()
        result[groups] = {"context": context.detach(), **{name: t.grad for name, t in local.items()}}
    whole = whole_inputs()
    outputs = whole["outputs"][:, mine].clone().requires_grad_(True)
    picked = gather_positions(outputs, whole["positions"], LENGTH, group)
    (picked * whole["pick_weight"]).sum().backward()  # the same loss on every rank, as the actor's is
    result.update(picked=picked.detach(), outputs_grad=outputs.grad)
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
