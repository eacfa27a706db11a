"""One update of an actor on 2 gloo ranks, each with half of a batch's rows, against one rank on the whole
batch: what a backend's two-rank test script saves (rank side) and what its test then compares (test side).
Used by the torchtitan and veomni two-rank tests."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist


def save_half_batch_update(actor, batch, out: str, **extra) -> None:
    """Rank side: this rank's half of ``batch`` (which every rank computed alike), its log-probs, one update;
    rank 0 writes the log-probs, its shard sizes and the weights after the update (by Hugging Face name) to
    ``out``, with ``extra``; each rank writes its metrics beside it."""
    rank = dist.get_rank()
    mine = batch.select(range(2 * rank, 2 * rank + 2))
    log_probs = actor.compute_log_prob(mine)["old_log_probs"]
    metrics = actor.update(mine)
    weights = {name: tensor for bucket in actor.weights_for_rollout(1 << 20) for name, tensor in bucket}
    shards = [p.to_local().numel() for p in actor.module.parameters()]
    torch.save(metrics, f"{out}.metrics{rank}")
    if rank == 0:
        torch.save({"log_probs": log_probs, "metrics": metrics, "weights": weights, "sharded": shards, **extra}, out)
    dist.barrier()


def check_updated_as_one_rank(two: dict, out, one_rank, metrics: dict, weights_atol: float) -> None:
    """Test side: the two ranks' weights after their update are one rank's after its update on the whole batch
    (within ``weights_atol``), their grad norm is its, and the average of their losses is its loss (the driver
    averages the ranks' metrics: rlcore.workers.group.reduce_metrics)."""
    weights = {name: tensor for bucket in one_rank.weights_for_rollout(1 << 20) for name, tensor in bucket}
    assert two["weights"].keys() == weights.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(two["weights"][name], tensor, atol=weights_atol, rtol=1e-5, msg=name)
    assert two["metrics"]["actor/grad_norm"] == pytest.approx(metrics["actor/grad_norm"], rel=1e-4)
    ranks = [torch.load(f"{out}.metrics{rank}", weights_only=False) for rank in (0, 1)]
    for name in ("actor/pg_loss", "actor/entropy"):
        assert sum(r[name] for r in ranks) / 2 == pytest.approx(metrics[name], rel=1e-4), name
