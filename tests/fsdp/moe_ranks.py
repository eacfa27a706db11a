"""The 2-rank half of test_moe.py: run as ``python -m tests.fsdp.moe_ranks MODEL OUT`` in two processes
with torchrun's variables, on the CPU (gloo). MODEL is a tiny Qwen3 mixture of experts.

Each rank takes half of the rows and writes ``OUT/rank<r>.pt``: per run (padded, packed) its rows'
log-probs before the step, and the step's metrics, full gradients and full weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore.testing import build_actor
from tests.fsdp.helpers import make_batch
from tests.fsdp.two_ranks import actor_step, advantages, config

ROWS = 8
RUNS = [("padded", {"ppo_mini_batch_size": ROWS, "ppo_micro_batch_size_per_gpu": 2}, False),
        ("packed", {"ppo_mini_batch_size": ROWS, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 24}, True)]


def shard(rank: int, ranks: int) -> slice:
    return slice(rank * ROWS // ranks, (rank + 1) * ROWS // ranks)


def main(model_path: str, out: str) -> None:
    from rlcore.plugins.manager import get_manager

    torch.set_num_threads(1)
    manager = get_manager()
    backend, platform = manager.get("training_backends", "fsdp"), manager.get("platforms", "cpu")()
    results = {}
    for name, actor_settings, packed in RUNS:
        actor = build_actor(backend, config(model_path, actor_settings, packed), platform)  # joins the group
        rows = shard(dist.get_rank(), dist.get_world_size())
        batch = make_batch(ROWS).select(range(ROWS)[rows])
        results[name] = {"log_probs": actor.compute_log_prob(batch)["old_log_probs"],
                         **actor_step(actor, batch, advantages()[rows])}
    torch.save(results, Path(out) / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
