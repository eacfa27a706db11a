"""Stopping a job on a signal: SIGINT (Ctrl-C), SIGTERM (``kill``, ``timeout``, every scheduler) and
SIGHUP (a closed terminal) all end ``rlcore train`` the same way.

The first signal raises ``Stopped`` in the driver wherever it is (generation, reward workers, update,
checkpoint, validation), so the job's ``finally`` blocks run: the reward and tool workers close, the
worker groups and the Ray instance the job started shut down, a checkpoint being written is dropped
(the last complete one stays the latest), and Ray's temp folder is removed. The command then exits
with 128 + the signal's number (130, 143, 129). A second signal while that clean-up runs forces the
exit at once: every process the driver started is killed first, so nothing is left behind.

Ray's start replaces SIGTERM's handler in the driver with one that aborts the process; the worker
groups call ``keep_handlers`` around it so that the job's own handler stays. A signal that arrives
while the driver waits in ``ray.get`` or ``ray.wait`` reaches the job as a plain ``KeyboardInterrupt``
(Ray's wait catches the ``Stopped`` its signal check raised); ``stop_on_signals`` raises it as the
``Stopped`` of the signal that came.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A stop signal arrived; ``exit_code`` is the shell's status for it (128 + its number)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum

    def __reduce__(self):
        """Pickled by its signal number: torch's distributed checkpoint gathers an exception raised inside
        a save (a stop arriving there) to its coordinator, and the default (the name as the argument)
        could not be rebuilt."""
        return type(self), (self.signum,)


def stop_within(exc: BaseException) -> Stopped | None:
    """The stop ``exc`` is or carries: torch's distributed checkpoint gathers an exception raised inside
    a save (a stop signal arriving there) into a ``CheckpointException`` whose ``failures`` map each
    rank to (exception, trace)."""
    if isinstance(exc, Stopped):
        return exc
    failures = getattr(exc, "failures", None)
    for failure in failures.values() if isinstance(failures, dict) else ():
        inner = failure[0] if isinstance(failure, tuple) and failure else failure
        if isinstance(inner, Stopped):
            return inner
    return None


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (children first), read from /proc; empty where there is none."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (name) state ppid ...": the name may hold spaces and parentheses, so split after its end
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    found, queue = [], list(children.get(pid, []))
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue.extend(children.get(child, []))
    return found


def force_exit(exit_code: int) -> None:
    """Kill every process this one started, then end it with ``exit_code`` without further clean-up."""
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os._exit(exit_code)


@contextlib.contextmanager
def stop_on_signals(echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
                    ) -> Iterator[None]:
    """Within the block, the first stop signal raises ``Stopped``; the second forces the exit."""
    import threading

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    received: list[int] = []

    def handle(signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if received:
            echo(f"rlcore: {name} again: stopping now, without clean-up")
            force_exit(128 + received[0])
        received.append(signum)
        echo(f"rlcore: {name} received: stopping the job (the last complete checkpoint is kept; "
             "send it again to stop at once)")
        raise Stopped(signum)

    previous = {signum: signal.signal(signum, handle) for signum in STOP_SIGNALS}
    try:
        yield
    except KeyboardInterrupt as exc:
        # Ray's waits (ray.get, ray.wait) run the handler inside their own signal check, catch what it
        # raises and raise a plain KeyboardInterrupt instead: the stop it stands for is still ours
        if received and not isinstance(exc, Stopped):
            raise Stopped(received[0]) from exc
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def keep_handlers() -> Iterator[None]:
    """Whatever the block installs at the C level for the stop signals (Ray's start does, for SIGTERM)
    is replaced again by the Python handlers that were set before it."""
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in before.items():
            if handler is not None:  # None: set outside Python, nothing of ours to restore
                signal.signal(signum, handler)
