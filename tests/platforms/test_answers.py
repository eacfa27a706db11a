"""What each platform answers to the questions backends, engines and worker groups ask.

Every answer here is one a caller would otherwise get from a vendor check; the simulated vendor
stacks come from conftest.py.
"""

from __future__ import annotations

import sys

import pytest
import torch

from rlcore.plugins.manager import PluginManager
from rlcore.runtime.platforms import CpuPlatform, CudaPlatform, Platform
from rlcore_ascend.platform import AscendPlatform
from rlcore_rocm.platform import RocmPlatform

GIB = 1 << 30


@pytest.mark.parametrize(
    ("cls", "device_type", "dist_backend", "dist_init_backend", "ray_options", "visible"),
    [
        (CpuPlatform, "cpu", "gloo", "gloo", {}, {}),
        (CudaPlatform, "cuda", "nccl", "cpu:gloo,cuda:nccl", {"num_gpus": 1},
         {"CUDA_VISIBLE_DEVICES": "2,3"}),
        (RocmPlatform, "cuda", "nccl", "cpu:gloo,cuda:nccl", {"num_gpus": 1},
         {"HIP_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"}),
        (AscendPlatform, "npu", "hccl", "cpu:gloo,npu:hccl", {"resources": {"NPU": 1}},
         {"ASCEND_RT_VISIBLE_DEVICES": "2,3"}),
    ],
)
def test_device_backend_ray_and_visible_devices(cls, device_type, dist_backend, dist_init_backend, ray_options,
                                                visible):
    platform = cls()
    assert platform.device_type == device_type
    assert platform.dist_backend == dist_backend
    assert platform.dist_init_backend == dist_init_backend
    assert platform.ray_actor_options(1) == ray_options
    assert platform.ray_actor_options(0) == {}
    assert platform.visible_devices_env_for([2, 3]) == visible


@pytest.mark.parametrize("cls", [CpuPlatform, CudaPlatform, RocmPlatform, AscendPlatform])
def test_every_platform_implements_the_whole_interface(cls):
    assert issubclass(cls, Platform) and not cls.__abstractmethods__
    assert cls.name and cls.device_type and cls.dist_backend


def test_cpu_answers_on_this_machine():
    cpu = CpuPlatform()
    assert cpu.device() == torch.device("cpu") and cpu.device(3) == torch.device("cpu")
    assert cpu.device_count() == 1 and cpu.device_name()
    stats = cpu.memory_stats()
    assert set(stats) == {"allocated", "reserved", "peak_allocated", "total"}
    assert 0 < stats["allocated"] <= stats["total"]
    assert cpu.default_dtype == torch.float32
    assert cpu.device_module is torch.cpu
    assert cpu.engine_env("vllm") == cpu.engine_env("sglang") == {}  # the engine plugins know their own
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    cpu.reconcile_visible_devices(env)
    assert env == {"CUDA_VISIBLE_DEVICES": "1"}


def test_seeding_is_reproducible():
    cpu = CpuPlatform()
    cpu.manual_seed(7)
    first = torch.rand(3)
    cpu.manual_seed(7)
    assert torch.equal(first, torch.rand(3))


def test_cuda_answers_on_a_simulated_nvidia_machine(nvidia_torch):
    cuda = CudaPlatform()
    assert cuda.device(1) == torch.device("cuda", 1)
    assert cuda.device_count() == 2 and cuda.device_name(1) == "NVIDIA H200 #1"
    assert cuda.memory_stats(0) == {"allocated": GIB, "reserved": 2 * GIB, "peak_allocated": 3 * GIB,
                                    "peak_reserved": 4 * GIB, "total": 192 * GIB}
    assert cuda.default_dtype == torch.bfloat16
    assert cuda.device_module is torch.cuda
    cuda.set_device(1)
    cuda.manual_seed(3)
    cuda.empty_cache()
    # torch.manual_seed seeds torch.cuda too; the platform's own call makes sure of it.
    assert nvidia_torch.calls[0] == ("set_device", 1) and nvidia_torch.calls[-1] == ("empty_cache",)
    assert ("manual_seed_all", 3) in nvidia_torch.calls
    assert cuda.engine_env("vllm") == {}


def test_rocm_answers_on_a_simulated_amd_machine(rocm_torch):
    rocm = RocmPlatform()
    assert rocm.device(1) == torch.device("cuda", 1)  # HIP devices are torch's "cuda" devices
    assert rocm.ray_resource == "GPU"
    assert rocm.device_count() == 8 and rocm.device_name(0) == "AMD Instinct MI300X #0"
    assert rocm.memory_stats(0)["total"] == 192 * GIB
    rocm.set_device(2)
    rocm.manual_seed(5)
    rocm.empty_cache()
    assert rocm_torch.calls[0] == ("set_device", 2) and rocm_torch.calls[-1] == ("empty_cache",)
    assert ("manual_seed_all", 5) in rocm_torch.calls
    assert rocm.engine_env("vllm") == {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    assert rocm.engine_env("sglang") == {}


def test_ascend_answers_through_a_simulated_torch_npu(fake_torch_npu):
    fake_torch_npu(count=8)
    ascend = AscendPlatform()
    assert ascend.device_count() == 8 and ascend.device_name(3) == "Ascend910B3"
    assert ascend.device_module is torch.npu
    assert ascend.memory_stats(0) == {"allocated": GIB, "reserved": 2 * GIB, "peak_allocated": 3 * GIB,
                                      "total": 64 * GIB}
    assert ascend.default_dtype == torch.bfloat16
    ascend.set_device(4)
    ascend.manual_seed(11)
    ascend.empty_cache()
    assert torch.npu.calls == [("set_device", 4), ("manual_seed_all", 11), ("empty_cache",)]
    assert ascend.engine_env("vllm") == {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "VLLM_ASCEND_ENABLE_NZ": "0"}
    assert ascend.engine_env("sglang") == {}
    env = {"ASCEND_RT_VISIBLE_DEVICES": "0,1"}
    ascend.reconcile_visible_devices(env)
    assert env == {"ASCEND_RT_VISIBLE_DEVICES": "0,1"}


def test_loading_the_ascend_plugin_never_imports_torch_npu(fake_torch_npu, monkeypatch):
    fake_torch_npu(count=8)
    for module in ["rlcore_ascend", "rlcore_ascend.platform"]:  # imported afresh, put back afterwards
        monkeypatch.delitem(sys.modules, module, raising=False)
    manager = PluginManager(only=["ascend"])
    assert "ascend" in manager.registry("platforms")
    assert "torch_npu" not in sys.modules
    assert manager.get("platforms", "ascend").is_available()  # detection is where it is imported
    assert "torch_npu" in sys.modules
