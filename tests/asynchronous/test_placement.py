"""The colocated form's placement on a real Ray with two logical GPUs: the rollout workers join the
trainer workers' bundles, rank r beside rank r on the same GPU, each taking half of it; a GPU's whole
bundle is then taken."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest
import ray

from rlcore.asynchronous.workers import placement
from rlcore.errors import RlcoreError
from rlcore.runtime.platforms import CpuPlatform
from rlcore.workers.group import WorkerGroup


class LogicalGpuPlatform(CpuPlatform):
    """The CPU platform reserving Ray's ``GPU`` resource, as the CUDA platform does: a GPU machine's
    placement on Ray's logical GPUs."""

    ray_resource = "GPU"


class PlacedWorker:
    """What a worker group calls while it starts, and where Ray put the worker."""

    def __init__(self, config, plan, roles, rank, world_size, processes_per_node):
        self.rank, self.processes_per_node = rank, processes_per_node

    def execute(self, method: str, *args):
        return getattr(self, method)(*args), 0.0

    def rendezvous_address(self, world_size: int) -> str:
        return "127.0.0.1:0"

    def setup(self, master: str) -> None:
        pass

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def placement(self):
        return placement()

    def processes(self) -> int:
        return self.processes_per_node


@pytest.fixture
def two_gpu_ray(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    temp_dir = tempfile.mkdtemp(prefix="rlcore-ray-")  # short: Ray's socket paths live under it
    ray.init(num_cpus=6, num_gpus=2, include_dashboard=False, _temp_dir=temp_dir, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_rollout_workers_share_their_trainer_workers_gpus_half_each(two_gpu_ray):
    platform = LogicalGpuPlatform()
    trainer = WorkerGroup("trainer", None, None, platform, 2, 1, ("actor",), worker_class=PlacedWorker, shared_by=2)
    rollout = WorkerGroup("rollout", None, None, platform, 2, 1, ("rollout",), worker_class=PlacedWorker,
                          place_with=trainer)
    try:
        trainers, engines = trainer.call_all("placement"), rollout.call_all("placement")
        assert trainers == engines  # rank for rank: one node, one GPU
        assert sorted(devices["GPU"][0] for _, devices in trainers) == ["0", "1"]  # one GPU for each pair
        assert trainer.device_share == rollout.device_share == 0.5
        # four processes on the node (two trainers, two engines) divide its cores: each a quarter
        assert trainer.call_all("processes") == rollout.call_all("processes") == [4, 4]
        assert ray.available_resources().get("GPU", 0) == 0  # both GPUs reserved, by the trainer's bundles
        with pytest.raises(RlcoreError, match="cannot share the bundles of the trainer workers"):
            WorkerGroup("other", None, None, platform, 1, 1, ("rollout",), worker_class=PlacedWorker,
                        place_with=trainer)  # one worker cannot pair with two
    finally:
        rollout.shutdown()
        trainer.shutdown()
    deadline = time.monotonic() + 30  # Ray frees a removed placement group's resources shortly after
    while ray.available_resources().get("GPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("GPU") == 2  # the trainer's group gave its placement groups back


@pytest.mark.slow
def test_two_engines_per_gpu_sit_beside_their_trainer_worker_a_third_of_the_gpu_each(two_gpu_ray):
    platform = LogicalGpuPlatform()
    trainer = WorkerGroup("trainer", None, None, platform, 2, 1, ("actor",), worker_class=PlacedWorker, shared_by=3)
    rollout = WorkerGroup("rollout", None, None, platform, 2, 1, ("rollout",), worker_class=PlacedWorker,
                          place_with=trainer, per_bundle=2)
    try:
        trainers, engines = trainer.call_all("placement"), rollout.call_all("placement")
        assert rollout.world_size == 4
        assert engines == [trainers[0], trainers[0], trainers[1], trainers[1]]  # ranks 2r and 2r + 1 beside r
        assert trainers[0] != trainers[1]
        assert trainer.device_share == rollout.device_share == pytest.approx(1 / 3)
        assert trainer.call_all("processes") == [6, 6] and rollout.call_all("processes") == [6] * 4
        assert rollout.call_ranks("processes", [3, 1]) == [6, 6]  # some ranks, in the order asked
        with pytest.raises(RlcoreError, match="cannot share the bundles of the trainer workers"):
            WorkerGroup("other", None, None, platform, 2, 1, ("rollout",), worker_class=PlacedWorker,
                        place_with=trainer, per_bundle=3)  # a bundle made for three processes holds no four
    finally:
        rollout.shutdown()
        trainer.shutdown()


def test_the_processes_on_a_node_divide_its_cores():
    from rlcore.workers.hybrid import host_threads

    assert host_threads(16, 1) == 16  # one trainer, nothing beside it
    assert host_threads(16, 2) == 8  # the colocated form on one GPU: the trainer and its engine
    assert host_threads(2, 4) == 1  # never none
