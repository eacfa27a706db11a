"""Which platform a process gets: detection order, the RLCORE_PLATFORM override, and its errors."""

from __future__ import annotations

import sys

import pytest

import rlcore.plugins.manager
from rlcore.errors import RlcoreError
from rlcore.plugins.manager import PluginManager
from rlcore.runtime.platforms import CpuPlatform, CudaPlatform, current_platform, detect_platform
from rlcore_ascend.platform import AscendPlatform
from rlcore_rocm.platform import RocmPlatform


@pytest.fixture
def registered() -> dict:
    """The four platforms, as the plugin manager registers them (built-ins plus the two plugins)."""
    registry = PluginManager(only=["rocm", "ascend"]).registry("platforms")
    return {name: registry.get(name) for name in registry}


def test_the_plugins_register_rocm_and_ascend_beside_the_built_ins(registered):
    assert registered == {"cpu": CpuPlatform, "cuda": CudaPlatform, "rocm": RocmPlatform, "ascend": AscendPlatform}
    assert all(cls.name == name for name, cls in registered.items())


def test_detection_order_is_ascend_rocm_cuda_cpu(registered):
    order = sorted(registered.values(), key=lambda cls: cls.detect_order)
    assert [cls.name for cls in order] == ["ascend", "rocm", "cuda", "cpu"]


def test_a_cpu_only_torch_gets_the_cpu(registered, cpu_torch):
    assert isinstance(detect_platform(registered), CpuPlatform)


def test_a_cuda_build_on_nvidia_gets_cuda(registered, nvidia_torch):
    assert isinstance(detect_platform(registered), CudaPlatform)
    assert not RocmPlatform.is_available()


def test_a_rocm_build_gets_rocm_never_cuda(registered, rocm_torch):
    # A ROCm build answers torch.cuda.is_available() too; only torch.version tells them apart.
    assert type(detect_platform(registered)) is RocmPlatform
    assert not CudaPlatform.is_available()


def test_a_rocm_build_without_a_visible_gpu_gets_the_cpu(registered, rocm_torch):
    rocm_torch.count = 0
    assert isinstance(detect_platform(registered), CpuPlatform)


def test_ascend_comes_first_when_torch_npu_reports_devices(registered, rocm_torch, fake_torch_npu):
    fake_torch_npu(count=8)
    assert isinstance(detect_platform(registered), AscendPlatform)


def test_torch_npu_without_devices_is_skipped(registered, nvidia_torch, fake_torch_npu):
    fake_torch_npu(count=0)
    assert isinstance(detect_platform(registered), CudaPlatform)


def test_without_torch_npu_ascend_is_unavailable_and_nothing_is_imported(cpu_torch):
    assert not AscendPlatform.is_available()
    assert "torch_npu" not in sys.modules


def test_rlcore_platform_forces_an_available_platform(registered, rocm_torch, monkeypatch):
    monkeypatch.setenv("RLCORE_PLATFORM", "cpu")
    assert isinstance(detect_platform(registered), CpuPlatform)
    assert isinstance(detect_platform(registered, forced="rocm"), RocmPlatform)


def test_an_unknown_forced_platform_lists_the_registered_ones(registered, monkeypatch):
    monkeypatch.setenv("RLCORE_PLATFORM", "rcom")
    with pytest.raises(RlcoreError) as err:
        detect_platform(registered)
    message = str(err.value)
    assert "'rcom' is not a registered platform" in message
    assert 'did you mean "rocm"' in message
    assert "registered platforms: ascend, cpu, cuda, rocm" in message


@pytest.mark.parametrize("forced", ["ascend", "rocm", "cuda"])
def test_an_unavailable_forced_platform_says_so_and_lists_the_registered_ones(registered, cpu_torch, forced):
    with pytest.raises(RlcoreError) as err:
        detect_platform(registered, forced=forced)
    message = str(err.value)
    assert f"{forced!r} was forced but that platform is not available" in message
    assert "registered platforms: ascend, cpu, cuda, rocm" in message


def test_a_broken_torch_npu_is_an_error_not_a_silent_cpu_fallback(registered, cpu_torch, fake_torch_npu):
    fake_torch_npu(import_error="libhccl.so: cannot open shared object file")
    with pytest.raises(RlcoreError, match="torch_npu is installed but failed to import.*libhccl.*RLCORE_PLATFORM"):
        detect_platform(registered)
    # Forcing another platform does not probe torch_npu at all.
    assert isinstance(detect_platform(registered, forced="cpu"), CpuPlatform)


def test_current_platform_detects_once_through_the_plugin_manager(rocm_torch, monkeypatch):
    monkeypatch.setattr(rlcore.plugins.manager, "_manager", PluginManager(only=["rocm", "ascend"]))
    platform = current_platform()
    assert type(platform) is RocmPlatform
    assert current_platform() is platform


def test_current_platform_obeys_rlcore_platform(rocm_torch, monkeypatch):
    monkeypatch.setattr(rlcore.plugins.manager, "_manager", PluginManager(only=["rocm", "ascend"]))
    monkeypatch.setenv("RLCORE_PLATFORM", "ascend")
    with pytest.raises(RlcoreError, match="registered platforms: ascend, cpu, cuda, rocm"):
        current_platform()
