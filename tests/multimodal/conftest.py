"""A tiny Qwen2-VL-shaped model and `rlcore data shapes` rows for the vision-language tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_vlm_path(tmp_path_factory) -> Path:
    from rlcore.testing import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl")


@pytest.fixture(scope="session")
def shapes_data(tmp_path_factory) -> dict[str, Path]:
    """8 train and 4 test rows of 56 x 56 images (16 patches, 4 image tokens on the tiny model)."""
    from rlcore.data.shapes import ShapesTask, write

    return write(tmp_path_factory.mktemp("shapes"), ShapesTask(image_size=56), train_size=8, test_size=4, seed=0)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from threads on a busy 2-core machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="package", autouse=True)
def no_process_group_left_behind():
    """The fsdp backend makes a one-rank process group in this process; tear it down after these tests."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
