"""The 2-rank half of test_router_replay.py's Ulysses case: ``python -m tests.fsdp.router_replay_ranks MODEL OUT``
in two processes (gloo on the CPU), the actor of a tiny Qwen3-MoE with Ulysses sequence parallelism 2 (both
ranks one group that splits each packed micro-batch's sequence) and router replay. Each rank is handed its
half of the rows and writes ``OUT/rank<r>.pt``: R2's column, log-probs and update metrics; R3's log-probs
for a hand-made column."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore.batch import Batch
from rlcore.testing import build_actor
from tests.fsdp import two_ranks
from tests.fsdp.helpers import make_batch

SP = 2
ACTOR = {"ppo_mini_batch_size": two_ranks.ROWS, "ppo_micro_batch_size_per_gpu": 3, "shuffle": False}


def config(model_path, mode: str, sp: int):
    return two_ranks.config(model_path, {**ACTOR, "router_replay": mode, "ulysses_sequence_parallel_size": sp},
                            packed=True)


def hand_made_column(batch: Batch) -> torch.Tensor:
    """Layer 0 to experts (3, 2), layer 1 to (1, 0), for every real token; -1 at pads."""
    rows, width = batch["input_ids"].shape
    column = torch.tensor([[3, 2], [1, 0]], dtype=torch.int16).expand(rows, width, 2, 2).clone()
    column[~batch["attention_mask"].bool()] = -1
    return column


def main(model_path: str, out: str) -> None:
    from rlcore.plugins.manager import get_manager

    torch.set_num_threads(1)
    manager = get_manager()
    backend = manager.get("training_backends", "fsdp")
    platform = manager.get("platforms", "cpu")()
    rows = two_ranks.ROWS
    rank = int(os.environ["RANK"])
    share = slice(rank * rows // 2, (rank + 1) * rows // 2)
    batch = make_batch(rows).select(range(rows)[share])
    actor = build_actor(backend, config(model_path, "R2", SP), platform)
    old = actor.compute_log_prob(batch)
    metrics = actor.update(batch.update(old).update(Batch({"advantages": two_ranks.advantages()[share]})))
    replayed = build_actor(backend, config(model_path, "R3", SP), platform).compute_log_prob(
        batch.update(Batch({"routed_experts": hand_made_column(batch)})))
    results = {"column": old["routed_experts"], "log_probs": old["old_log_probs"], "metrics": metrics,
               "r3_log_probs": replayed["old_log_probs"]}
    torch.save(results, Path(out) / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
