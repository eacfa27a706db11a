"""One rank of the batch-sharing check, started by ``torchrun --nproc_per_node 4`` on the CPU (gloo)
from ``test_share_within_model_parallel.py``: for each (tensor, pipeline) layout, megatron-core's own
parallel state, an update's batch cut as the worker group cuts it (``data_parallel_shares`` over
``MegatronBackend.data_parallel_ranks``) and put together by ``share_within_model_parallel``; rank 0
writes every rank's data-parallel rank and rows as JSON to argv[1]."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from rlcore.batch import Batch
from rlcore.config import load_job
from rlcore.training.specs import training_spec
from rlcore.workers.group import data_parallel_shares
from rlcore_megatron.backend import MegatronBackend
from rlcore_megatron.compute import share_within_model_parallel

LAYOUTS = [(2, 1, 6), (1, 2, 6), (2, 2, 7), (1, 1, 8)]  # (tensor, pipeline, rows of the batch)


def main(out: str) -> None:
    from megatron.core import parallel_state as ps

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for tp, pp, rows in LAYOUTS:
        ps.initialize_model_parallel(tp, pp)
        config = load_job(None, ["model_engine=megatron", f"actor.megatron.tensor_model_parallel_size={tp}",
                                 f"actor.megatron.pipeline_model_parallel_size={pp}"], check=False).config
        groups = MegatronBackend().data_parallel_ranks(training_spec(config, "actor"), world)
        shares = data_parallel_shares(rows, groups, "update_actor")
        start = sum(shares[:rank])
        row_ids = torch.arange(rows)[:, None] * 10 + torch.arange(3)  # (rows, 3): row r holds 10r, 10r+1, 10r+2
        given = row_ids[start:start + shares[rank]]
        mine = Batch({"input_ids": given, "responses": -given})
        shared, own = share_within_model_parallel(mine, ("input_ids", "responses"), torch.device("cpu"))
        assert torch.equal(shared["responses"], -shared["input_ids"])
        results.append({"dp_rank": ps.get_data_parallel_rank(), "group": groups[rank],
                        "given": (mine["input_ids"][:, 0] // 10).tolist(),
                        "union": (shared["input_ids"][:, 0] // 10).tolist(),
                        "own": (shared["input_ids"][own][:, 0] // 10).tolist()})
        ps.destroy_model_parallel()
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"layouts": LAYOUTS, "ranks": gathered}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
