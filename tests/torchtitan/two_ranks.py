"""Run as 2 gloo ranks by tests/torchtitan/test_two_ranks.py: the torchtitan actor sharded over both,
each rank with half of the rows; rank 0 writes the log-probs of its rows and the weights after one
update (by Hugging Face name), each rank its metrics, for the test to compare with one rank on all the rows."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from rlcore.runtime.platforms import CpuPlatform
from rlcore.testing import build_actor
from rlcore_torchtitan.backend import TorchtitanBackend
from tests.torchtitan.test_roles import job, update_batch


def main(model_path: str, out: str) -> None:
    actor = build_actor(TorchtitanBackend(), job(model_path), CpuPlatform())
    rank = dist.get_rank()
    batch = update_batch(actor)  # every rank computes the whole batch's old log-probs alike
    mine = batch.select(range(2 * rank, 2 * rank + 2))
    log_probs = actor.compute_log_prob(mine)["old_log_probs"]
    metrics = actor.update(mine)
    weights = {name: tensor for bucket in actor.weights_for_rollout(1 << 20) for name, tensor in bucket}
    shards = [p.to_local().numel() for p in actor.module.parameters()]
    torch.save(metrics, f"{out}.metrics{rank}")
    if rank == 0:
        torch.save({"log_probs": log_probs, "metrics": metrics, "weights": weights, "sharded": shards}, out)
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
