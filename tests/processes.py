"""Processes that tests start: each runs in its own process group with a deadline. At the deadline
(or if the test itself is interrupted, e.g. by pytest-timeout) the whole group and every descendant
are killed, and the test fails naming the job, so a hung job costs minutes, not the CI's budget."""

from __future__ import annotations

import os
import signal
import subprocess

import psutil
import pytest


def kill_family(process: subprocess.Popen) -> None:
    """SIGKILL ``process``, its process group and every descendant (Ray's workers may sit in other groups)."""
    try:
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for member in family:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=30)


def _tail(text: str | None, limit: int = 4000) -> str:
    return (text or "")[-limit:]


def run_process(args: list[str], *, name: str, timeout: float, **popen) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True)`` with a deadline that kills the job's
    process group and fails the test, naming ``name``."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_family(process)
        try:
            stdout, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a stray process still holds the pipes: report without them
            stdout, stderr = "", ""
        pytest.fail(f"{name} did not finish in {timeout} s: its process group was killed\n"
                    f"--- stdout (tail)\n{_tail(stdout)}\n--- stderr (tail)\n{_tail(stderr)}")
    except BaseException:  # the test was interrupted: leave no process behind
        kill_family(process)
        raise
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def wait_or_fail(process: subprocess.Popen, *, name: str, timeout: float) -> int:
    """Wait for a process a test started itself; at the deadline kill its family and fail, naming it."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_family(process)
        pytest.fail(f"{name} did not finish in {timeout} s: its process group was killed")
