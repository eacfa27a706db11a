"""A plugin that makes a whole job stall in a chosen phase, so that a test can act (stop it, kill it)
while the job is inside that phase; and the start, watch and signal loop of such tests
(``background_job``, ``BackgroundJob.wait_until``, ``.stop``, ``freeze_inside_a_save``).

The plugin is a real plugin, loaded as every plugin is: a module and an entry point of group
``rlcore`` in a folder the job finds on its ``PYTHONPATH`` (``install_stall_plugin``; Ray's workers get
the same ``PYTHONPATH``). It registers

- ``stall/hf``, the ``hf`` rollout engine that, in phase ``generation``, keeps generating (real
  generations, one after the other) instead of returning;
- ``stall/vanilla``, the vanilla policy loss that, in phase ``update``, waits inside the actor's update
  (between a micro-batch's forward and its backward) instead of returning.

It stalls the first call of its phase made once the run folder holds a complete checkpoint
(``latest_checkpointed_iteration.txt`` exists), writes the marker file when it starts to, and never
stalls again while the marker exists, so the same job resumes with the same settings. A stall that no
signal ends fails the job after ``STALL_LIMIT_S``.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from tests.processes import kill_family

STALL_LIMIT_S = 120

PLUGIN = '''"""rlcore test plugin (tests/e2e/stalls.py): stalls the job in phase {phase!r}."""

import os
import time

from rlcore.api import PolicyLoss, RolloutEngine, hookimpl

PHASE, MARKER, ARMED, LIMIT_S = {phase!r}, {marker!r}, {armed!r}, {limit_s!r}


def _due(phase):
    return PHASE == phase and os.path.exists(ARMED) and not os.path.exists(MARKER)


def _stall(work):
    open(MARKER, "w").close()
    end = time.monotonic() + LIMIT_S
    while time.monotonic() < end:
        work()
    raise RuntimeError(f"the stall plugin waited {{LIMIT_S}} s in phase {{PHASE}} for a signal that never came")


@hookimpl
def rlcore_register_rollout_engines(register):
    from rlcore.rollout.hf import HfRollout

    class StallingHfRollout(HfRollout):
        def generate(self, prompts, sampling):
            if _due("generation"):
                _stall(lambda: HfRollout.generate(self, prompts, sampling))
            return super().generate(prompts, sampling)

    register("stall/hf", RolloutEngine(StallingHfRollout, borrows_actor_module=True))


@hookimpl
def rlcore_register_policy_losses(register):
    from rlcore.algorithms.policy_losses import vanilla

    def stalling_vanilla(*args, **kwargs):
        if _due("update"):
            _stall(lambda: time.sleep(0.05))
        return vanilla(*args, **kwargs)

    register("stall/vanilla", PolicyLoss(stalling_vanilla))
'''

PHASE_OVERRIDES = {"generation": ["rollout.name=stall/hf"], "update": ["actor.policy_loss=stall/vanilla"]}


def install_stall_plugin(site: Path, phase: str, marker: Path, run: Path) -> Path:
    """Write the plugin for ``phase`` into ``site`` (a folder for the job's ``PYTHONPATH``); it stalls the
    job whose run folder is ``run``. Returns ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "rlcore_stall_plugin.py").write_text(PLUGIN.format(
        phase=phase, marker=str(marker), armed=str(run / "latest_checkpointed_iteration.txt"),
        limit_s=STALL_LIMIT_S))
    dist = site / "rlcore_stall_plugin-0.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rlcore-stall-plugin\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[rlcore]\nstall = rlcore_stall_plugin\n")
    return site


def folder_digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by relative path, with the sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class BackgroundJob:
    """A job started with ``start_train``, its output in ``log``."""

    def __init__(self, process: subprocess.Popen, log: Path):
        self.process, self.log = process, log

    def output(self) -> str:
        return self.log.read_text()

    def wait_until(self, condition: Callable[[], object], what: str, timeout: float = 300, poll_s: float = 0.2):
        """Poll ``condition`` until it returns something true, and return that; fail, with the job's
        output, when the job ends first or at the deadline."""
        deadline = time.monotonic() + timeout
        while not (found := condition()):
            assert self.process.poll() is None, f"the job ended (status {self.process.returncode}) before {what}:\n" \
                                                 f"{self.output()}"
            assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s:\n{self.output()}"
            time.sleep(poll_s)
        return found

    def family(self) -> list[psutil.Process]:
        """The driver and every process below it, now."""
        driver = psutil.Process(self.process.pid)
        return [driver, *driver.children(recursive=True)]

    def signal_family(self, signum: int) -> None:
        """``signum`` to the job's process group at once, then to every process below the driver (Ray's
        may sit in groups of their own; found first: a killed driver's children move to another parent)."""
        try:
            family = self.family()
        except psutil.NoSuchProcess:
            family = []
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass
        for member in family:
            try:
                member.send_signal(signum)
            except psutil.NoSuchProcess:
                pass

    def stop(self, signum: int, *, frozen: bool = False, timeout: float = 60) -> Stop:
        """Send ``signum`` to the driver only, as ``kill`` and ``timeout`` do, and wait for the job to end.
        ``frozen``: the job was stopped (``signal_family(SIGSTOP)``); it continues once the signal is
        pending, so that the signal lands where the job was frozen."""
        family = self.family()
        sent = time.monotonic()
        self.process.send_signal(signum)
        if frozen:
            self.signal_family(signal.SIGCONT)
        status = self.process.wait(timeout=timeout)
        seconds = time.monotonic() - sent
        _, alive = psutil.wait_procs(family, timeout=30)
        return Stop(status, seconds, alive, self.output())


class Stop:
    """How a signalled job ended: its exit status, the seconds from the signal to its end, and its
    processes still alive 30 s later."""

    def __init__(self, status: int, seconds: float, alive: list, output: str):
        self.status, self.seconds, self.alive, self.output = status, seconds, alive, output

    def check(self, signum: int) -> None:
        """Exit 128 + the signal within 30 s, the job's own handler (not Ray's) took it, nothing left running."""
        assert self.status == 128 + signum, f"exit status {self.status}, not {128 + signum}:\n{self.output}"
        assert self.seconds < 30, f"the job took {self.seconds:.0f} s to stop: {self.output}"
        name = signal.Signals(signum).name
        assert f"{name} received" in self.output and f"rlcore: stopped by {name}" in self.output, self.output
        assert "*** SIGTERM received" not in self.output, self.output
        assert not self.alive, f"processes left after the stop: {self.alive}\n{self.output}"


@contextmanager
def background_job(start: Callable[..., subprocess.Popen], log: Path) -> Iterator[BackgroundJob]:
    """``start(stdout=...)`` with its output in ``log``; on leaving, every process of the job is killed."""
    with open(log, "w") as out:
        process = start(stdout=out)
        try:
            yield BackgroundJob(process, log)
        finally:
            kill_family(process)


def staging_folder(run: Path, after: int = 0) -> tuple[int, Path] | None:
    """(step, folder) of a checkpoint being written in ``run`` for a step after ``after``, or None."""
    for path in run.glob(".global_step_*.tmp-*"):
        step = int(path.name.split(".")[1].removeprefix("global_step_"))
        if step > after:
            return step, path
    return None


def freeze_inside_a_save(job: BackgroundJob, run: Path, after: int = 1, timeout: float = 300) -> int:
    """Stop (SIGSTOP) the job's process group while it writes a checkpoint of a step after ``after``, and
    return that step; the save is then in progress (its staging folder there, the checkpoint not yet
    published). A save that finishes between the sighting and the freeze is let go; the next is taken."""
    deadline = time.monotonic() + timeout
    while True:
        found = job.wait_until(lambda: staging_folder(run, after), "a checkpoint write",
                               timeout=max(deadline - time.monotonic(), 0.001), poll_s=0.002)
        job.signal_family(signal.SIGSTOP)
        step, staging = found
        if staging.exists() and not (run / f"global_step_{step}").exists():
            return step
        job.signal_family(signal.SIGCONT)  # it finished in between: let it go on to the next save
        after = step
