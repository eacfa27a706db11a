"""Run as 2 gloo ranks by tests/torchtitan/test_two_ranks.py: the torchtitan actor sharded over both,
each rank with half of the rows; rank 0 writes the log-probs of its rows and the weights after one
update (by Hugging Face name), each rank its metrics, for the test to compare with one rank on all the rows."""

from __future__ import annotations

import sys


from rlcore.runtime.platforms import CpuPlatform
from rlcore.testing import build_actor
from rlcore_torchtitan.backend import TorchtitanBackend
from tests.half_batch_update import save_half_batch_update
from tests.torchtitan.test_roles import job, update_batch


def main(model_path: str, out: str) -> None:
    actor = build_actor(TorchtitanBackend(), job(model_path), CpuPlatform())
    save_half_batch_update(actor, update_batch(actor), out)  # every rank computes the whole batch's old log-probs


if __name__ == "__main__":
    main(*sys.argv[1:])
