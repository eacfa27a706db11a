"""Tool calls run in worker processes of their own, with a timeout per call.

A training process never runs a tool: a stuck or crashing tool costs one worker, which is killed
and replaced, and the call reads as an error. Workers are spawned (not forked from a process that
holds models and threads) and receive each tool's ``execute`` by reference (a module-level function,
pickled as its module and name), so tools of in-process plugins run there too.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import attrs

from rlcore.tools import ToolResult


@attrs.frozen
class ToolCall:
    name: str
    arguments: dict


@attrs.frozen
class CallOutcome:
    result: ToolResult
    seconds: float
    timed_out: bool = False


def _serve(requests, responses) -> None:
    """A worker's loop: (call id, execute, arguments) in, (call id, ToolResult) out."""
    while True:
        item = requests.get()
        if item is None:
            return
        call_id, execute, arguments = item
        try:
            result = execute(arguments)
        except Exception as exc:  # noqa: BLE001 - a failing tool is an error the model reads
            result = ToolResult(f"error: {type(exc).__name__}: {exc}", error=True)
        responses.put((call_id, result))


class _Worker:
    def __init__(self, context):
        self.requests, self.responses = context.Queue(), context.Queue()
        self.process = context.Process(target=_serve, args=(self.requests, self.responses), daemon=True)
        self.process.start()

    def stop(self) -> None:
        self.process.kill()
        self.process.join(timeout=10)


class ToolRunner:
    """Runs tool calls on ``workers`` processes; ``run(calls)`` returns one outcome per call, in order."""

    def __init__(self, tools: dict, workers: int = 2):
        self.tools = tools  # name -> Tool, for timeouts and to refuse unknown names before dispatch
        self._context = multiprocessing.get_context("spawn")
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._counter = 0
        for _ in range(workers):
            self._add_worker()
        self._threads = ThreadPoolExecutor(workers)

    def _add_worker(self) -> None:
        worker = _Worker(self._context)
        with self._lock:
            self._all.append(worker)
        self._idle.put(worker)

    def run(self, calls: list[ToolCall]) -> list[CallOutcome]:
        return list(self._threads.map(self._run_one, calls))

    def _run_one(self, call: ToolCall) -> CallOutcome:
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return CallOutcome(ToolResult(f"error: unknown tool {call.name!r}; tools: {known}", error=True), 0.0)
        worker = self._idle.get()
        with self._lock:
            self._counter += 1
            call_id = self._counter
        started = time.monotonic()
        worker.requests.put((call_id, tool.execute, call.arguments))
        try:
            _, result = worker.responses.get(timeout=tool.timeout_s)
        except queue.Empty:  # stuck: this worker goes, a fresh one takes its place
            worker.stop()
            with self._lock:
                self._all.remove(worker)
            self._add_worker()
            return CallOutcome(ToolResult(f"error: {call.name} did not answer within {tool.timeout_s:g} s",
                                          error=True), time.monotonic() - started, timed_out=True)
        self._idle.put(worker)
        return CallOutcome(result, time.monotonic() - started)

    def close(self) -> None:
        self._threads.shutdown()
        for worker in self._all:
            worker.requests.put(None)
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
