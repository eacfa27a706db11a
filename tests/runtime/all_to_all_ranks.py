"""One rank of the all-to-all check, started by ``tests.ranks.run_ranks`` (3 CPU ranks, gloo) from
``test_all_to_all.py``: rank r exchanges its (2, 6, 4) tensor (dimension 1 scattered, 0 gathered),
back-propagates a loss weighted by its own weights, tries a tensor that does not split, and saves
its input, weights, output, input gradient and that error to argv[1]/rank{r}.pt."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore.api import all_to_all

SHAPE = (2, 6, 4)


def inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s tensor and its loss weights, the same wherever they are drawn."""
    g = torch.Generator().manual_seed(rank)
    return torch.randn(SHAPE, generator=g), torch.randn(6, 2, 4, generator=g)


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor, weight = inputs(rank)
    tensor.requires_grad_(True)
    exchanged = all_to_all(tensor, 1, 0, dist.group.WORLD)  # (2, 6, 4) -> (6, 2, 4)
    (exchanged * weight).sum().backward()
    try:
        all_to_all(torch.zeros(2, 5, 4), 1, 0, dist.group.WORLD)
        error = ""
    except ValueError as exc:
        error = str(exc)
    torch.save({"output": exchanged.detach(), "grad": tensor.grad, "error": error}, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
