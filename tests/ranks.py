"""Run a test module as several ranks of one CPU process group (gloo), as torchrun would."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import kill_family

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(module: str, *args: str, world: int = 2, timeout: int = 240) -> None:
    """``python -m module args...`` in ``world`` processes with torchrun's variables (one CPU thread
    each, the cpu platform); fails the test with the failing rank's output if one does not exit 0."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "RLCORE_PLATFORM": "cpu",
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
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
