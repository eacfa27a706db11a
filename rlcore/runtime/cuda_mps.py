"""CUDA MPS for a colocated job: the trainer's and the engine's kernels side by side on one GPU.

Two processes on one GPU otherwise take turns: the driver gives each context a time slice, so an
engine's small decoding kernels wait whenever the trainer's slice runs, and the two phases add up
more than they overlap. Under MPS (the Multi-Process Service) the processes' kernels share the GPU
at the same moment; limiting the trainer to a share of the streaming multiprocessors
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) keeps some always free for the engine. Measured on one H200
with ``benchmarks/gpu_sharing.py`` (docs/async.md, "Kernels side by side").

rlcore starts an MPS control daemon of the job's own (its pipe and log folders in a temporary folder,
so that it disturbs no other daemon on the machine), hands its folders to the job's worker processes
through their environment, checks that a client can start under it, and stops it when the job ends.
Where the machine already runs a daemon that this process is a client of (``CUDA_MPS_PIPE_DIRECTORY``
set), rlcore uses that one and leaves it running.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from rlcore.errors import SharingUnavailable

CONTROL = "nvidia-cuda-mps-control"
# A client's first work under the daemon: a bf16 matrix product against its float32 reference. Under
# MPS with the streaming multiprocessors limited to 60, 70 or 80% (not 50, 75 or 90%), this product came out
# wrong on an H200 (driver 580.159.04, torch 2.11.0+cu130: max error ~330 on values of ~64; finite, so no NaN
# guard would catch it before the loss): benchmarks/gpu_sharing.py --check. So every share a job will use
# is checked before any worker starts under it.
CLIENT_CHECK = """
import torch
torch.manual_seed(0)
a, b = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
error = ((a.bfloat16() @ b.bfloat16()).float() - a @ b).abs().max().item()
print(error)
raise SystemExit(0 if error < 2.0 else 3)
"""
# The shares whose product came out right there (the H200, driver 580.159.04) and under which whole jobs
# trained with finite values (H100 and H200): the error message offers them, and
# async_training.trainer_compute_share defaults to one of them. 75% and 90% passed the product, but a job
# under 75% on an H100 had NaN losses from its first step (2026-12-06), so the check is necessary, not
# sufficient; 90% never ran a job.
SHARES_CHECKED_RIGHT = (0.5,)
DAEMON_START_S = 30  # how long the control daemon may take to start (it daemonizes at once where it can)


class MpsSharing:
    """A running MPS control daemon and the environment its clients need."""

    def __init__(self, folders: dict[str, str], owned_folder: str | None, binary: str | None):
        self.folders = folders  # CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY
        self.owned_folder = owned_folder  # None: a daemon rlcore did not start
        self.binary = binary

    @property
    def description(self) -> str:
        whose = "a daemon of this job's own" if self.owned_folder else "the machine's running daemon"
        return f"CUDA MPS ({whose})"

    def env(self, compute_share: float = 1.0, yields: bool = False) -> dict[str, str]:
        """The variables of a process that joins: the daemon's folders, for ``compute_share`` < 1 the
        share of the GPU's streaming multiprocessors its kernels may use, and with ``yields`` the
        below-normal client priority (``CUDA_MPS_CLIENT_PRIORITY`` 1: the other clients' kernels are
        scheduled first when both wait; NVIDIA's MPS guide documents 0, normal, and 1)."""
        env = dict(self.folders)
        if compute_share < 1.0:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(100 * compute_share)))
        if yields:
            env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
        return env

    def stop(self) -> None:
        """Stop a daemon this job started (it waits for its clients to exit) and remove its folders."""
        if self.owned_folder is None:
            return
        try:
            subprocess.run([self.binary], input=b"quit\n", env=os.environ | self.folders, capture_output=True,
                           timeout=60)
        except subprocess.TimeoutExpired:
            print(f"warning: the MPS control daemon in {self.owned_folder} did not stop within 60 s", file=sys.stderr)
        shutil.rmtree(self.owned_folder, ignore_errors=True)
        self.owned_folder = None


def mps_missing() -> str | None:
    """Why no MPS daemon can be started or joined here, where that shows without starting one (no
    ``nvidia-cuda-mps-control`` on PATH, as in many containers); None where one may start."""
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or shutil.which(CONTROL):
        return None
    return f"{CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities)"


def start_mps(compute_shares: tuple[float, ...] = (1.0,), binary: str | None = None,
              check_client: bool = True) -> MpsSharing:
    """Start an MPS control daemon of this job's own (or join the one this process already uses) and
    check that a client limited to each of ``compute_shares`` computes right under it.
    ``SharingUnavailable`` says why not."""
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):  # the machine's daemon: its shares are checked as our own's
        folders = {name: os.environ[name] for name in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
                   if name in os.environ}
        sharing = MpsSharing(folders, None, None)
    else:
        sharing = _start_daemon(binary or shutil.which(CONTROL))
    for share in compute_shares if check_client else ():
        problem = _client_problem(sharing, share)
        if problem:
            sharing.stop()
            raise SharingUnavailable(problem)
    return sharing


def _start_daemon(binary: str | None) -> MpsSharing:
    """A control daemon of this job's own, in a temporary folder; ``SharingUnavailable`` where it does not
    start (its folder removed, and a daemon that answered too late stopped)."""
    if binary is None:
        raise SharingUnavailable(mps_missing())
    owned = tempfile.mkdtemp(prefix="rlcore-mps-")
    folders = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(owned, "pipe"),
               "CUDA_MPS_LOG_DIRECTORY": os.path.join(owned, "log")}
    for folder in folders.values():
        os.makedirs(folder)
    sharing = MpsSharing(folders, owned, binary)
    try:
        started = subprocess.run([binary, "-d"], env=os.environ | folders, capture_output=True, text=True,
                                 timeout=DAEMON_START_S)
    except subprocess.TimeoutExpired:
        sharing.stop()
        raise SharingUnavailable(f"{CONTROL} -d gave no answer within {DAEMON_START_S} s") from None
    if started.returncode != 0:
        shutil.rmtree(owned, ignore_errors=True)
        raise SharingUnavailable(f"{CONTROL} -d exited with {started.returncode}: "
                                 f"{(started.stderr or started.stdout).strip()[-500:]}")
    return sharing


def _client_problem(sharing: MpsSharing, share: float) -> str | None:
    """Why a client limited to ``share`` of the GPU cannot work under the daemon, or None."""
    limited = f" limited to {share:.0%} of the GPU's streaming multiprocessors" if share < 1.0 else ""
    try:
        client = subprocess.run([sys.executable, "-c", CLIENT_CHECK], env=os.environ | sharing.env(share),
                                capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return f"a CUDA process{limited} gave no answer within 120 s under the MPS daemon"
    if client.returncode == 3:
        return (f"under MPS, a process{limited} computed a bf16 matrix product wrong (max error "
                f"{client.stdout.strip()}): a fault of this driver and library with that share; give the "
                f"async_training key set to {share:g} (trainer_compute_share or engine_compute_share) another "
                "value (" + ", ".join(map(str, SHARES_CHECKED_RIGHT)) + " computed and trained right on an H100 "
                "and an H200)")
    if client.returncode != 0:
        logs = sharing.folders.get("CUDA_MPS_LOG_DIRECTORY")  # the machine's daemon may keep its own
        log = _read(os.path.join(logs, "control.log")) if logs else ""
        return (f"a CUDA process{limited} could not start under the MPS daemon: "
                f"{client.stderr.strip()[-300:]} {log[-300:]}").strip()
    return None


def _read(path: str) -> str:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return ""
