"""Reward functions in a supervised pool of worker processes.

A reward function is the user's code: it may raise, call ``sys.exit``, hang, or kill its own process
(``os._exit``, a signal). In the driver any of these would end or freeze the whole job; here each
call runs in one of ``reward.num_workers`` worker processes, and the pool
- gives every call at most ``reward.timeout_s`` seconds, and the whole batch ``reward.batch_timeout_s``;
- replaces a worker that timed out (killed) or died, and carries on with the next sample;
- reports each failure as an ``Outcome`` naming what happened, for the scorer's ``reward.on_error``.

Workers are started once (``spawn``: a fresh interpreter, not a fork of a driver that runs Ray and
torch threads) and serve many batches. They ignore Ctrl-C: the driver handles it and closes the pool.
A function travels by reference: a registered one as itself (pickled by its import path), a user
file's as ``FileFunction`` (path and name, loaded once per worker).
"""

from __future__ import annotations

import collections
import multiprocessing
import time
from multiprocessing.connection import Connection, wait
from typing import Any

import attrs


@attrs.frozen
class FileFunction:
    """A function defined in a user's file (``reward.custom_reward_function``): loaded in the worker."""

    path: str
    name: str


@attrs.frozen
class Outcome:
    ok: bool
    value: Any  # the function's return value, or (not ok) what went wrong, as a phrase
    seconds: float
    timed_out: bool = False


def _resolve(reference, cache: dict):
    if not isinstance(reference, FileFunction):
        return reference
    if reference not in cache:
        from rlcore.rewards.custom import load_reward_function

        cache[reference] = load_reward_function(reference.path, reference.name)
    return cache[reference]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        from rlcore.errors import describe_exit

        return describe_exit(exc)
    return f"raised {type(exc).__name__}: {exc}"


def _serve(conn: Connection) -> None:
    """A worker: call what arrives, send back (ok, value or problem, seconds), until None arrives."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    cache: dict = {}
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the driver went away
            return
        if message is None:
            return
        reference, kwargs = message
        start = time.perf_counter()
        try:
            value = _resolve(reference, cache)(**kwargs)
            reply = (True, value)
        except BaseException as exc:  # noqa: BLE001 - the user's code may raise anything, SystemExit too
            reply = (False, _describe(exc))
        try:
            conn.send((*reply, time.perf_counter() - start))
        except Exception as exc:  # noqa: BLE001 - a return value that does not pickle
            conn.send((False, f"returned a value that cannot be sent back ({type(exc).__name__}: {exc})",
                       time.perf_counter() - start))


class _Worker:
    def __init__(self, context):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True, name="rlcore-reward")
        self.process.start()
        child.close()
        self.index: int | None = None  # the call it runs
        self.started = 0.0

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


def _death(worker: _Worker) -> str:
    worker.process.join(timeout=5)  # its exit code is set once it is reaped
    return f"killed its worker process (exit code {worker.process.exitcode})"


class RewardPool:
    """``workers`` processes that run reward calls with per-call and per-batch time limits."""

    def __init__(self, workers: int, timeout_s: float, batch_timeout_s: float | None = None):
        self.context = multiprocessing.get_context("spawn")
        self.timeout_s, self.batch_timeout_s = timeout_s, batch_timeout_s
        self.workers = [_Worker(self.context) for _ in range(workers)]
        self.replaced = 0  # workers replaced after a timeout or a death, over the pool's life

    def run(self, calls: list[tuple[Any, dict]]) -> list[Outcome]:
        """One ``Outcome`` per ``(function reference, keyword arguments)`` call, in order."""
        outcomes: list[Outcome | None] = [None] * len(calls)
        pending = collections.deque(range(len(calls)))
        deadline = None if self.batch_timeout_s is None else time.monotonic() + self.batch_timeout_s
        while pending or any(w.index is not None for w in self.workers):
            for worker in self.workers:
                if worker.index is None and pending:
                    worker.index, worker.started = pending.popleft(), time.monotonic()
                    worker.conn.send(calls[worker.index])
            busy = [w for w in self.workers if w.index is not None]
            now = time.monotonic()
            limit = min(w.started + self.timeout_s for w in busy)
            if deadline is not None:
                limit = min(limit, deadline)
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy], max(0.0, limit - now)))
            now = time.monotonic()
            for worker in busy:
                if worker.conn in ready:
                    index = worker.index  # _receive frees the worker
                    outcomes[index] = self._receive(worker)
                elif worker.process.sentinel in ready:
                    outcomes[worker.index] = Outcome(False, _death(worker), now - worker.started)
                    self._replace(worker)
                elif now >= worker.started + self.timeout_s:
                    outcomes[worker.index] = Outcome(False, f"did not return within reward.timeout_s = "
                                                            f"{self.timeout_s:g} s", now - worker.started, True)
                    self._replace(worker)
            if deadline is not None and now >= deadline:
                for worker in [w for w in self.workers if w.index is not None]:
                    outcomes[worker.index] = Outcome(False, "was still running when the batch reached "
                                                            f"reward.batch_timeout_s = {self.batch_timeout_s:g} s",
                                                     now - worker.started, True)
                    self._replace(worker)
                while pending:
                    outcomes[pending.popleft()] = Outcome(False, "was not started before the batch reached "
                                                                 f"reward.batch_timeout_s = {self.batch_timeout_s:g} s",
                                                          0.0, True)
        return outcomes

    def _receive(self, worker: _Worker) -> Outcome:
        try:
            ok, value, seconds = worker.conn.recv()
        except (EOFError, OSError):  # it died while answering
            outcome = Outcome(False, _death(worker), time.monotonic() - worker.started)
            self._replace(worker)
            return outcome
        worker.index = None
        return Outcome(ok, value, seconds)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self.workers[self.workers.index(worker)] = _Worker(self.context)
        self.replaced += 1

    def close(self) -> None:
        for worker in self.workers:
            try:
                worker.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for worker in self.workers:
            worker.process.join(timeout=5)
            worker.kill()
        self.workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
