from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("fsdp-models") / "tiny-qwen2")


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory) -> Path:
    """A Llama-family tiny model (SmolLM2's family): its forward builds masks differently from Qwen2's."""
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("fsdp-models") / "tiny-llama", family="llama")


@pytest.fixture(scope="session")
def platform():
    from rlcore.runtime.platforms import current_platform

    return current_platform()


@pytest.fixture(scope="session")
def backend():
    from rlcore.plugins.manager import get_manager

    return get_manager().get("training_backends", "fsdp")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and on a busy 2-core machine two threads that wait on
    each other make every small op ~100x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="package", autouse=True)
def no_process_group_left_behind():
    """The backend makes a one-rank process group in this process when none exists; it belongs to
    these tests, so tear it down after them: a later test may make its own (tests/platforms does)."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
