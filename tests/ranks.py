"""Run a test module as several ranks of one CPU process group (gloo), as torchrun would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from rlcore.runtime.rendezvous import listening_store
from tests.processes import kill_family

REPO = Path(__file__).resolve().parents[1]


def rank_environment(rank: int, world: int, port: int, one_gpu_each: bool = False,
                     one_gpu_for_all: bool = False) -> dict[str, str]:
    """torchrun's variables for ``rank``, every rank a client of the store at ``port`` (torchrun's
    ``TORCHELASTIC_USE_AGENT_STORE``: the launcher hosts it). On the CPU: one thread, the cpu platform. With
    ``one_gpu_each``: rank r sees only GPU r (``CUDA_VISIBLE_DEVICES``), as a Ray worker of one GPU does,
    so every rank's device is its ``cuda:0`` (NCCL refuses two ranks on one device). With
    ``one_gpu_for_all``: every rank sees only GPU 0, as the colocated workers of one device do."""
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True",
           "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if one_gpu_each or one_gpu_for_all:
        env["CUDA_VISIBLE_DEVICES"] = "0" if one_gpu_for_all else str(rank)
        env.pop("RLCORE_PLATFORM", None)
    else:
        env["RLCORE_PLATFORM"] = "cpu"
    return env


def run_ranks(module: str, *args: str, world: int = 2, timeout: int = 240, one_gpu_each: bool = False,
              one_gpu_for_all: bool = False) -> None:
    """``python -m module args...`` in ``world`` processes with torchrun's variables (see
    ``rank_environment``); fails the test with the failing rank's output if one does not exit 0."""
    # the ranks' store, listening here before any rank starts, as torchrun's agent hosts it
    store = listening_store("127.0.0.1", world, timedelta(seconds=timeout))
    procs = []
    for rank in range(world):
        env = rank_environment(rank, world, store.port, one_gpu_each, one_gpu_for_all)
        procs.append(subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    logs = []
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {world}-rank run of {module} did not finish in {timeout} s: its processes were killed")
    finally:  # on a timeout, a failed rank or an interrupted test, no rank outlives the test
        for proc in procs:
            if proc.poll() is None:
                kill_family(proc)
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} of {module} failed:\n{logs[rank][-4000:]}"
