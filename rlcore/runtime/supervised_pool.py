"""A supervised pool of worker processes for code that must not run in the driver: reward functions
and tool calls (``rlcore.rewards.pool``, ``rlcore.tools.runner``).

Such code is the user's or the model's: it may raise, call ``sys.exit``, hang, or kill its own
process (``os._exit``, a signal). In the driver any of these would end or freeze the whole job; here
each call runs in one of ``workers`` processes, and the pool
- gives every call a time limit (its own ``timeout_s``, else the pool's), and a batch an optional
  limit for all of its calls together;
- replaces a worker that timed out (killed) or died, and carries on with the next call;
- reports each failure as an ``Outcome`` naming what happened.

Workers are started once (``spawn``: a fresh interpreter, not a fork of a driver that runs Ray and
torch threads) and serve many batches. A call's time starts when its worker has it in hand: a
worker's start-up and the import of the call's module (when it unpickles the call) are not counted,
up to ``STARTUP_S`` more seconds. They ignore Ctrl-C: the driver handles it and closes the pool.
A call's function travels by reference (pickled by its import path), so it must be importable by
name: a module-level function, or a picklable callable object that loads the function it stands for.
"""

from __future__ import annotations

import collections
import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import attrs

from rlcore.errors import describe_exit

STARTUP_S = 60.0  # a fresh worker's start and the import of a call's module, beyond the call's limit
_STARTED = "started"  # a worker's word that it unpickled a call and runs it now


@attrs.frozen
class Call:
    """``function(*args, **kwargs)`` in a worker, within ``timeout_s`` (None: the pool's)."""

    function: Callable
    args: tuple = ()
    kwargs: dict = attrs.field(factory=dict)
    timeout_s: float | None = None


@attrs.frozen
class Outcome:
    ok: bool
    value: Any  # the function's return value, or (not ok) what went wrong, as a phrase
    seconds: float
    timed_out: bool = False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return describe_exit(exc)
    return f"raised {type(exc).__name__}: {exc}"


def _serve(conn: Connection) -> None:
    """A worker: call what arrives, send back (ok, value or problem, seconds), until None arrives."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the driver went away
            return
        if message is None:
            return
        conn.send(_STARTED)
        function, args, kwargs = message
        start = time.perf_counter()
        try:
            reply = (True, function(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - the user's code may raise anything, SystemExit too
            reply = (False, _describe(exc))
        try:
            conn.send((*reply, time.perf_counter() - start))
        except Exception as exc:  # noqa: BLE001 - a return value that does not pickle
            conn.send((False, f"returned a value that cannot be sent back ({type(exc).__name__}: {exc})",
                       time.perf_counter() - start))


class _Outcomes:
    """The outcomes of one batch, by index; a failure is passed on to ``on_failure`` as it is stored."""

    def __init__(self, size: int, on_failure: Callable[[int, Outcome], None] | None):
        self.values: list[Outcome | None] = [None] * size
        self.on_failure = on_failure

    def __setitem__(self, index: int, outcome: Outcome) -> None:
        self.values[index] = outcome
        if not outcome.ok and self.on_failure is not None:
            self.on_failure(index, outcome)


class _Worker:
    def __init__(self, context, name: str):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True, name=name)
        self.process.start()
        child.close()
        self.index: int | None = None  # the call it runs
        self.started = 0.0  # when it was sent the call, then when it said it started it
        self.loading = False  # sent a call, not yet started it (starting up, importing)
        self.timeout_s = 0.0  # the running call's limit

    def deadline(self) -> float:
        return self.started + self.timeout_s + (STARTUP_S if self.loading else 0.0)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


def _death(worker: _Worker) -> str:
    worker.process.join(timeout=5)  # its exit code is set once it is reaped
    return f"killed its worker process (exit code {worker.process.exitcode})"


def _limit(seconds: float, setting: str | None) -> str:
    return f"{setting} = {seconds:g} s" if setting else f"{seconds:g} s"


class SupervisedPool:
    """``workers`` processes that run calls with per-call and per-batch time limits.

    ``timeout_setting`` and ``batch_timeout_setting`` name the settings behind the limits in the
    failure phrases (``"did not return within reward.timeout_s = 5 s"``)."""

    def __init__(self, workers: int, timeout_s: float, batch_timeout_s: float | None = None, *,
                 name: str = "rlcore-worker", timeout_setting: str | None = None,
                 batch_timeout_setting: str | None = None):
        if workers < 1:
            raise ValueError(f"a supervised pool needs at least one worker, got {workers}")
        self.context = multiprocessing.get_context("spawn")
        self.name = name
        self.timeout_s, self.batch_timeout_s = timeout_s, batch_timeout_s
        self.timeout_setting, self.batch_timeout_setting = timeout_setting, batch_timeout_setting
        self.workers = [_Worker(self.context, name) for _ in range(workers)]
        self.replaced = 0  # workers replaced after a timeout or a death, over the pool's life

    def run(self, calls: list[Call], on_failure: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
        """One ``Outcome`` per call, in order. ``on_failure(index, outcome)`` hears of each failed or
        timed-out call as soon as it is known, while the others still run."""
        outcomes = _Outcomes(len(calls), on_failure)
        pending = collections.deque(range(len(calls)))
        deadline = None if self.batch_timeout_s is None else time.monotonic() + self.batch_timeout_s
        while pending or any(w.index is not None for w in self.workers):
            for worker in self.workers:
                if worker.index is None and pending:
                    call = calls[pending[0]]
                    worker.index, worker.started, worker.loading = pending.popleft(), time.monotonic(), True
                    worker.timeout_s = self.timeout_s if call.timeout_s is None else call.timeout_s
                    worker.conn.send((call.function, tuple(call.args), dict(call.kwargs)))
            busy = [w for w in self.workers if w.index is not None]
            now = time.monotonic()
            limit = min(w.deadline() for w in busy)
            if deadline is not None:
                limit = min(limit, deadline)
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy], max(0.0, limit - now)))
            now = time.monotonic()
            for worker in busy:
                if worker.conn in ready:
                    self._receive(worker, outcomes)
                elif worker.process.sentinel in ready:
                    outcomes[worker.index] = Outcome(False, _death(worker), now - worker.started)
                    self._replace(worker)
                elif now >= worker.deadline():
                    setting = self.timeout_setting if calls[worker.index].timeout_s is None else None
                    outcomes[worker.index] = Outcome(
                        False, f"did not return within {_limit(worker.timeout_s, setting)}",
                        now - worker.started, True)
                    self._replace(worker)
            if deadline is not None and now >= deadline:
                batch_limit = _limit(self.batch_timeout_s, self.batch_timeout_setting)
                for worker in [w for w in self.workers if w.index is not None]:
                    outcomes[worker.index] = Outcome(False, f"was still running when the batch reached {batch_limit}",
                                                     now - worker.started, True)
                    self._replace(worker)
                while pending:
                    outcomes[pending.popleft()] = Outcome(
                        False, f"was not started before the batch reached {batch_limit}", 0.0, True)
        return outcomes.values

    def _receive(self, worker: _Worker, outcomes: _Outcomes) -> None:
        """Read the worker's next word: that it started its call, or the call's outcome (which frees it)."""
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):  # it died while answering
            outcomes[worker.index] = Outcome(False, _death(worker), time.monotonic() - worker.started)
            self._replace(worker)
            return
        if message == _STARTED:
            worker.started, worker.loading = time.monotonic(), False
            return
        ok, value, seconds = message
        outcomes[worker.index] = Outcome(ok, value, seconds)
        worker.index = None

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self.workers[self.workers.index(worker)] = _Worker(self.context, self.name)
        self.replaced += 1

    def close(self) -> None:
        for worker in self.workers:
            try:
                worker.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 5  # for all of them together: a worker inside a call never reads the None
        for worker in self.workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            worker.kill()
        self.workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
