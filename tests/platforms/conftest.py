"""Simulated vendor stacks: a torch that reports a CUDA or HIP build, and a fake ``torch_npu`` on sys.path.

Nothing here needs a GPU or NPU; what each simulation patches is undone after the test.
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch

from rlcore.runtime.platforms import reset_platform


@pytest.fixture(autouse=True)
def no_platform_state(monkeypatch):
    """Each test detects afresh, without the caller's RLCORE_PLATFORM."""
    monkeypatch.delenv("RLCORE_PLATFORM", raising=False)
    reset_platform()
    yield
    reset_platform()


class FakeGpuApi:
    """What the platforms call on ``torch.cuda``, answering as ``count`` GPUs named ``device_name``."""

    def __init__(self, count: int, device_name: str):
        self.count = count
        self.name = device_name
        self.calls: list[tuple] = []

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def get_device_name(self, index: int = 0) -> str:
        return f"{self.name} #{index}"

    def memory_allocated(self, index: int = 0) -> int:
        return 1 << 30

    def memory_reserved(self, index: int = 0) -> int:
        return 2 << 30

    def max_memory_allocated(self, index: int = 0) -> int:
        return 3 << 30

    def max_memory_reserved(self, index: int = 0) -> int:
        return 4 << 30

    def get_device_properties(self, index: int = 0):
        return types.SimpleNamespace(name=self.name, total_memory=192 << 30)

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache",))

    def manual_seed_all(self, seed: int) -> None:
        self.calls.append(("manual_seed_all", seed))

    def set_device(self, index: int) -> None:
        self.calls.append(("set_device", index))


def _simulate_gpu_build(monkeypatch, *, cuda: str | None, hip: str | None, count: int, name: str) -> FakeGpuApi:
    api = FakeGpuApi(count, name)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip)
    for attr in ["is_available", "device_count", "get_device_name", "memory_allocated", "memory_reserved",
                 "max_memory_allocated", "max_memory_reserved", "get_device_properties", "empty_cache",
                 "manual_seed_all", "set_device"]:
        monkeypatch.setattr(torch.cuda, attr, getattr(api, attr))
    return api


@pytest.fixture
def rocm_torch(monkeypatch) -> FakeGpuApi:
    """torch as a ROCm build reports itself: a HIP version, no CUDA version, torch.cuda answering."""
    return _simulate_gpu_build(monkeypatch, cuda=None, hip="6.4.43482", count=8, name="AMD Instinct MI300X")


@pytest.fixture
def nvidia_torch(monkeypatch) -> FakeGpuApi:
    """torch as a CUDA build on an NVIDIA machine reports itself."""
    return _simulate_gpu_build(monkeypatch, cuda="13.0", hip=None, count=2, name="NVIDIA H200")


@pytest.fixture
def cpu_torch(monkeypatch) -> FakeGpuApi:
    """A CPU-only build of torch (what this machine has), whatever the machine really has."""
    return _simulate_gpu_build(monkeypatch, cuda=None, hip=None, count=0, name="")


FAKE_TORCH_NPU = '''\
"""A stand-in for torch_npu: what importing it does (registers torch.npu), without an NPU."""
import sys
import types

import torch

if {import_error!r}:
    raise OSError({import_error!r})

npu = types.ModuleType("torch.npu")
npu.calls = []
npu.is_available = lambda: {count} > 0
npu.device_count = lambda: {count}
npu.get_device_name = lambda index=0: "Ascend910B3"
npu.memory_allocated = lambda index=0: 1 << 30
npu.memory_reserved = lambda index=0: 2 << 30
npu.max_memory_allocated = lambda index=0: 3 << 30
npu.get_device_properties = lambda index=0: types.SimpleNamespace(name="Ascend910B3", total_memory=64 << 30)
npu.empty_cache = lambda: npu.calls.append(("empty_cache",))
npu.manual_seed_all = lambda seed: npu.calls.append(("manual_seed_all", seed))
npu.set_device = lambda index: npu.calls.append(("set_device", index))
torch.npu = npu
sys.modules["torch.npu"] = npu
'''


@pytest.fixture
def fake_torch_npu(tmp_path, monkeypatch):
    """Install a fake ``torch_npu`` package on sys.path: ``fake_torch_npu(count=8, import_error=None)``.

    The platform imports it as it would the real one; the test sees ``torch.npu`` after that import.
    """

    def install(count: int = 8, import_error: str | None = None) -> None:
        package = tmp_path / "site" / "torch_npu"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(FAKE_TORCH_NPU.format(count=count, import_error=import_error))
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        importlib.invalidate_caches()

    yield install
    for module in ["torch_npu", "torch.npu"]:
        sys.modules.pop(module, None)
    if hasattr(torch, "npu"):
        delattr(torch, "npu")
