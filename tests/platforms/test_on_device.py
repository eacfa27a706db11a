"""The detected platform drives this machine's real accelerator. Skips, saying so, where there is none.

On the CPU-only development machine every test here skips; on the GPU machine (or a ROCm or Ascend
one) they run against the hardware through nothing but the platform's answers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlcore.runtime.platforms import CpuPlatform, CudaPlatform, Platform, detect_platform
from rlcore.runtime.rendezvous import host_store, store_at
from rlcore_ascend.platform import AscendPlatform
from rlcore_rocm.platform import RocmPlatform
from tests.processes import run_process

REPO = Path(__file__).resolve().parents[2]
ALL = {cls.name: cls for cls in (CpuPlatform, CudaPlatform, RocmPlatform, AscendPlatform)}
MIB = 1 << 20


@pytest.fixture
def platform() -> Platform:
    platform = detect_platform(ALL)
    if platform.name == "cpu":
        pytest.skip("no accelerator on this machine (the cpu platform's answers are tested in test_answers.py)")
    return platform


def test_tensors_memory_stats_and_seeding_on_the_device(platform):
    platform.set_device(0)
    assert platform.device_count() >= 1 and platform.device_name(0)
    before = platform.memory_stats(0)
    x = torch.ones(4 * MIB // 4, device=platform.device(0))  # 4 MiB of fp32
    platform.device_module.synchronize()
    stats = platform.memory_stats(0)
    assert stats["allocated"] >= before["allocated"] + 4 * MIB
    assert stats["allocated"] <= stats["reserved"] <= stats["total"]
    assert stats["peak_allocated"] >= stats["allocated"]
    del x
    platform.empty_cache()
    assert platform.memory_stats(0)["reserved"] < stats["reserved"]

    platform.manual_seed(3)
    first = torch.rand(4, device=platform.device(0))
    platform.manual_seed(3)
    assert torch.equal(first, torch.rand(4, device=platform.device(0)))


def test_a_process_group_on_dist_init_backend_reduces_device_and_cpu_tensors(platform):
    platform.set_device(0)
    store = store_at(host_store("127.0.0.1", 1), 0, 1)  # bound before it is named, as a worker group's
    dist.init_process_group(backend=platform.dist_init_backend, store=store, rank=0, world_size=1)
    try:
        on_device = torch.full((4,), 2.0, device=platform.device(0))
        on_cpu = torch.full((4,), 3.0)
        dist.all_reduce(on_device)
        dist.all_reduce(on_cpu)
        platform.device_module.synchronize()
        assert on_device.tolist() == [2.0] * 4 and on_cpu.tolist() == [3.0] * 4
    finally:
        dist.destroy_process_group()


def test_visible_devices_env_for_shows_a_child_exactly_that_device(platform):
    env = dict(os.environ)
    platform.reconcile_visible_devices(env)
    if env.get(platform.visible_devices_env) is not None:
        pytest.skip(f"{platform.visible_devices_env} is already set: this process's indices are not the machine's")
    last = platform.device_count() - 1
    env.update(platform.visible_devices_env_for([last]))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    child = (
        "import json; from tests.platforms.test_on_device import ALL; from rlcore.runtime.platforms import detect_platform; "
        "p = detect_platform(ALL); print(json.dumps([p.name, p.device_count(), p.device_name(0)]))"
    )
    out = run_process([sys.executable, "-c", child], name="a child process shown one device", timeout=120, env=env,
                      cwd=str(REPO))
    assert out.returncode == 0, out.stderr
    name, count, device_name = json.loads(out.stdout.strip().splitlines()[-1])
    assert (name, count, device_name) == (platform.name, 1, platform.device_name(last))
