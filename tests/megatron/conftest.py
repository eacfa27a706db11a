"""What the megatron tests share: the library they need, the device they need, the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest


def needs_megatron():
    """megatron.core, or skip: it needs Python >= 3.12 and a GPU build environment."""
    return pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install rlcore[megatron], "
                                                       "Python >= 3.12)")


def needs_accelerator(count: int = 1):
    """The current platform, or skip: megatron-core's forward hard-codes CUDA (RNG tracker, RoPE
    device, memory buffer), so the backend runs on accelerators only."""
    from rlcore.platforms import current_platform

    platform = current_platform()
    if platform.device_type == "cpu":
        pytest.skip("the megatron backend runs on GPUs only (megatron-core's forward hard-codes CUDA)")
    if platform.device_count() < count:
        pytest.skip(f"needs {count} devices, this machine has {platform.device_count()}")
    return platform


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("megatron-models") / "tiny-qwen2")
