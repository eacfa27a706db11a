"""The 2-rank half of test_ulysses_families.py: ``python -m tests.fsdp.ulysses_families_ranks MODELS OUT``
in two processes (gloo on the CPU). For every family folder under MODELS (tests/families.py), the actor
with Ulysses sequence parallelism 2 on packed rows computes the log-probs of this rank's share of the
rows, and counts the all-to-all exchanges that split it; a family the backend refuses records its
error instead. Writes ``OUT/rank<r>.pt``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import attrs
import torch
import torch.distributed as dist

from rlcore.testing import build_actor
from tests.families import FAMILIES
from tests.fsdp.helpers import job, make_batch
from tests.fsdp.ulysses_ranks import count_exchanges

SP, ROWS = 2, 5


def config(model_path, sp: int = SP):
    job_config = job(model_path, actor={"ulysses_sequence_parallel_size": sp})
    return attrs.evolve(job_config, model=attrs.evolve(job_config.model, use_remove_padding=True))


def share(rank: int) -> range:
    """Rank 0 takes 3 rows, rank 1 the other 2: uneven, as the worker group may hand them out."""
    return range(3) if rank == 0 else range(3, ROWS)


def main(models: str, out: str) -> None:
    from rlcore.plugins.manager import get_manager

    torch.set_num_threads(1)
    manager = get_manager()
    backend = manager.get("training_backends", "fsdp")
    platform = manager.get("platforms", "cpu")()
    rank = int(os.environ["RANK"])
    batch = make_batch(ROWS).select(share(rank))
    exchanges: dict = {}
    count_exchanges(exchanges)
    results: dict[str, object] = {}
    for family in FAMILIES:
        before = exchanges["exchanges"]
        try:
            actor = build_actor(backend, config(Path(models) / family), platform)
            results[family] = actor.compute_log_prob(batch)["old_log_probs"]
        except Exception as error:  # a refusal: both ranks refuse alike, before any exchange
            results[family] = f"{type(error).__name__}: {error}"
        results[f"{family}/exchanges"] = exchanges["exchanges"] - before
    torch.save(results, Path(out) / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
