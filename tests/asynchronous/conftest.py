"""Fixtures of the asynchronous tests: whether this machine can start CUDA MPS, which a colocated job's
arrangement reads at start (``Platform.device_sharing_missing``), and actors of a given size, from which it
chooses."""

from __future__ import annotations

import os

import pytest

from tests.models.test_size import header_only_safetensors


@pytest.fixture
def mps_control_on_path(tmp_path, monkeypatch):
    """``nvidia-cuda-mps-control`` on PATH (a program that does nothing), as on a machine with the NVIDIA
    driver's utilities: the arrangements by model size apply. No test here starts it."""
    folder = tmp_path / "mps-bin"
    folder.mkdir()
    program = folder / "nvidia-cuda-mps-control"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    return program


@pytest.fixture
def sized_model(tmp_path):
    """A model folder of a given size (config and a safetensors header; the count reads nothing else)."""
    def make(parameters: int):
        folder = tmp_path / f"model-{parameters}"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text('{"model_type": "qwen2"}')
        header_only_safetensors(folder / "model.safetensors", {"weight": [parameters]})
        return str(folder)
    return make
