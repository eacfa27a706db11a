"""One rank of the two-GPU megatron check, started by ``torchrun --nproc_per_node 2`` from
``test_on_device.py``: tensor parallel 2, pipeline parallel 2, context parallel 2 or (a mixture of
experts) expert parallel 2 over the same batch the test runs on one GPU; rank 0 writes the results as
JSON to argv[1]. Arguments: out, model path, TP, PP, EP, the rows of the batch (one mini-batch), which
are cut over the ranks as the worker group cuts an update's batch (equal parts for the data-parallel
groups, a group's part spread over its ranks: 7 rows at TP 2 give 4 and 3), CP, and actor.router_replay
(with "R2", the recorded routed_experts column too)."""

from __future__ import annotations

import json
import sys

import attrs
import torch
import torch.distributed as dist

from rlcore.batch import Batch
from rlcore.runtime.platforms import current_platform
from rlcore.testing import build_actor
from rlcore.training.specs import training_spec
from rlcore.workers.group import data_parallel_shares
from rlcore_megatron.backend import MegatronBackend
from rlcore_megatron.options import MegatronOptions
from tests.fsdp.helpers import RESPONSE_LENGTH, job, make_batch


def main(out: str, model_path: str, tp: int, pp: int, ep: int, rows: int, cp: int = 1,
         router_replay: str = "off") -> None:
    platform = current_platform()
    config = attrs.evolve(job(model_path, actor={"ppo_mini_batch_size": rows, "router_replay": router_replay}),
                          sections={"actor.megatron": MegatronOptions(tensor_model_parallel_size=tp,
                                                                      pipeline_model_parallel_size=pp,
                                                                      expert_model_parallel_size=ep,
                                                                      context_parallel_size=cp)})
    actor = build_actor(MegatronBackend(), config, platform)
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = make_batch(rows)
    groups = MegatronBackend().data_parallel_ranks(training_spec(config, "actor"), world)
    shares = data_parallel_shares(rows, groups, "update_actor")
    start = sum(shares[:rank])
    mine = batch.select(range(start, start + shares[rank]))  # as the worker group splits an update's batch
    log_probs = actor.compute_log_prob(mine)
    metrics = actor.update(mine.update(log_probs).update(Batch({"advantages": torch.ones(len(mine), RESPONSE_LENGTH)})))
    after = actor.compute_log_prob(mine)["old_log_probs"]
    gathered = [None] * world
    routed = log_probs["routed_experts"].tolist() if "routed_experts" in log_probs else []
    dist.all_gather_object(gathered, (log_probs["old_log_probs"].tolist(), after.tolist(), routed))
    if rank == 0:
        before = [row for part in gathered for row in part[0]]
        after_rows = [row for part in gathered for row in part[1]]
        routed_rows = [row for part in gathered for row in part[2]]
        with open(out, "w") as f:
            json.dump({"before": before, "after": after_rows, "metrics": metrics, "routed_experts": routed_rows}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
         int(sys.argv[6]) if len(sys.argv) > 6 else 8, int(sys.argv[7]) if len(sys.argv) > 7 else 1,
         sys.argv[8] if len(sys.argv) > 8 else "off")
