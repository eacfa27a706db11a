"""``async_training.engines_per_device``: engines that share a device are independent engines, each in a
process group of its own and seeded apart (the placement, the start line and whole jobs:
``test_placement.py``, ``test_auto.py``, ``tests/e2e/test_async.py``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import attrs

from rlcore.asynchronous.workers import RolloutWorker
from rlcore.config import load_job
from rlcore.training.roles import SamplingParams, group_seed

SHARING = ['async_training.mode="colocated"', "async_training.engines_per_device=2"]

# rank 1 of a pool of two whose rank 0 never joins: the second engine of a device, set up while the first
# starts (the trainer starts the engines of one device one after another)
SECOND_ENGINE = textwrap.dedent("""
    import torch.distributed as dist
    from rlcore.asynchronous.workers import RolloutWorker
    from rlcore.config import load_job
    from rlcore.runtime.rendezvous import host_store

    config = load_job(None, {overrides!r}).config
    worker = RolloutWorker(config, None, ("rollout",), rank=1, world_size=2, processes_per_node=1)
    worker.setup(host_store("127.0.0.1", 2))
    print("group", dist.get_rank(), dist.get_world_size())
""")


def test_an_engine_sharing_its_device_sets_up_alone_in_its_group():
    """Before engines_per_device had groups of their own, an H100 run hung here: the first engine's vLLM
    start waited in a collective over the pool's group for the second, which was to start after it."""
    script = SECOND_ENGINE.format(overrides=SHARING)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "group 0 1" in result.stdout  # rank 0 of a group of one


def test_engines_sharing_a_device_draw_apart_and_one_engine_draws_as_before():
    config = load_job(None, SHARING).config
    first, second = (RolloutWorker(config, None, ("rollout",), rank=r, world_size=2, processes_per_node=1)
                     for r in (0, 1))
    first.sharing_device = second.sharing_device = 2  # what setup reads from the job
    sampling = SamplingParams(n=8, seed=1234)
    seeds = [worker.engine_sampling(sampling).seed for worker in (first, second)]
    assert seeds == [group_seed(1234, 0), group_seed(1234, 1)] and seeds[0] != seeds[1]
    assert first.engine_sampling(attrs.evolve(sampling, seed=None)).seed is None  # unseeded stays unseeded
    alone = RolloutWorker(load_job(None, []).config, None, ("rollout",), rank=1, world_size=2, processes_per_node=1)
    assert alone.engine_sampling(sampling) is sampling  # one engine a device: its group mixes in its rank itself
