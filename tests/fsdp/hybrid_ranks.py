"""The 2-rank half of test_hybrid_shard.py: ``python -m tests.fsdp.hybrid_ranks MODEL OUT`` in two
processes (gloo on the CPU), the actor with ``fsdp_size = 1``: two replicas, each sharded over one
rank (hybrid sharding). Each rank writes ``OUT/rank<r>.pt``: its step and its parameters' placements."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import attrs
import torch
import torch.distributed as dist

from rlcore.testing import build_actor
from rlcore_fsdp.options import FsdpOptions
from tests.fsdp import two_ranks
from tests.fsdp.helpers import make_batch

SETTINGS = {"ppo_mini_batch_size": two_ranks.ROWS, "ppo_micro_batch_size_per_gpu": 2}


def config(model_path, fsdp_size: int):
    job = two_ranks.config(model_path, SETTINGS, packed=False)
    return attrs.evolve(job, sections={**job.sections, "actor.fsdp": FsdpOptions(fsdp_size=fsdp_size)})


def main(model_path: str, out: str) -> None:
    from torch.distributed.tensor import DTensor

    from rlcore.plugins.manager import get_manager

    torch.set_num_threads(1)
    manager = get_manager()
    platform = manager.get("platforms", "cpu")()
    rank, rows = int(os.environ["RANK"]), two_ranks.ROWS
    share = slice(rank * rows // 2, (rank + 1) * rows // 2)
    actor = build_actor(manager.get("training_backends", "fsdp"), config(model_path, 1), platform)
    weight = next(p for p in actor.module.parameters() if isinstance(p, DTensor))
    result = two_ranks.actor_step(actor, make_batch(rows).select(range(rows)[share]), two_ranks.advantages()[share])
    result["placements"] = [type(p).__name__ for p in weight.placements]
    result["mesh_shape"] = tuple(weight.device_mesh.shape)
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
