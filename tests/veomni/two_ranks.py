"""Run as 2 gloo ranks by tests/veomni/test_two_ranks.py: the veomni actor sharded by VeOmni's own FSDP2
(``build_parallelize_model``, each rank loading its part of the weights), each rank with half of the
rows; rank 0 writes the log-probs of its rows, its shard sizes and the weights after one update (by
Hugging Face name), each rank its metrics, for the test to compare with one rank on all the rows."""

from __future__ import annotations

import sys

import torch

from rlcore.batch import Batch
from rlcore.runtime.platforms import CpuPlatform
from rlcore.testing import build_actor
from rlcore_veomni.backend import VeomniBackend
from tests.fsdp.helpers import RESPONSE_LENGTH, job, make_batch
from tests.fsdp.test_families import packed
from tests.half_batch_update import save_half_batch_update


def update_batch(actor) -> Batch:
    """Four rows with the actor's old log-probs and advantages from -1 to 1."""
    batch = make_batch(4)
    advantages = torch.linspace(-1.0, 1.0, len(batch) * RESPONSE_LENGTH).view(-1, RESPONSE_LENGTH)
    return batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": advantages}))


def main(model_path: str, out: str) -> None:
    actor = build_actor(VeomniBackend(), packed(job(model_path, lr=1e-2)), CpuPlatform())
    save_half_batch_update(actor, update_batch(actor), out,  # every rank computes the whole batch's old log-probs
                           classes=[kind.__module__ for kind in type(actor.module).__mro__])


if __name__ == "__main__":
    main(*sys.argv[1:])
