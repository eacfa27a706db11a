"""Fixtures of the asynchronous tests: whether this machine can start CUDA MPS, which a colocated job's
arrangement reads at start (``Platform.device_sharing_missing``)."""

from __future__ import annotations

import os

import pytest


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
