"""Tool calls run in the supervised pool of worker processes (``rlcore.runtime.supervised_pool``), with each
tool's ``timeout_s`` per call.

A training process never runs a tool: a stuck or crashing tool costs one worker, which is killed
and replaced, and the call reads as an error the model sees. A tool's ``execute`` travels by
reference (a module-level function, pickled as its module and name), so tools of in-process
plugins run there too.
"""

from __future__ import annotations

import math

import attrs

from rlcore.runtime.supervised_pool import Call, SupervisedPool
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


class ToolRunner:
    """Runs tool calls on ``workers`` processes; ``run(calls)`` returns one outcome per call, in order."""

    def __init__(self, tools: dict, workers: int = 2):
        self.tools = tools  # name -> Tool, for timeouts and to refuse unknown names before dispatch
        default = max((tool.timeout_s for tool in tools.values()), default=10.0)
        self.pool = SupervisedPool(workers, default, name="rlcore-tool")

    def run(self, calls: list[ToolCall]) -> list[CallOutcome]:
        outcomes: list[CallOutcome | None] = [None] * len(calls)
        known = [i for i, call in enumerate(calls) if call.name in self.tools]
        for i, call in enumerate(calls):
            if call.name not in self.tools:
                names = ", ".join(sorted(self.tools)) or "none"
                outcomes[i] = CallOutcome(ToolResult(f"error: unknown tool {call.name!r}; tools: {names}",
                                                     error=True), 0.0)
        pooled = self.pool.run([Call(self.tools[calls[i].name].execute, (calls[i].arguments,),
                                     timeout_s=self.tools[calls[i].name].timeout_s) for i in known])
        for i, outcome in zip(known, pooled):
            outcomes[i] = CallOutcome(self._result(calls[i].name, outcome), outcome.seconds, outcome.timed_out)
        return outcomes

    @staticmethod
    def _result(name: str, outcome) -> ToolResult:
        if not outcome.ok:  # a failing tool is an error the model reads
            return ToolResult(f"error: {name} {outcome.value}", error=True)
        if not isinstance(outcome.value, ToolResult):
            return ToolResult(f"error: {name} returned {type(outcome.value).__name__}, not a ToolResult",
                              error=True)
        for signal, value in outcome.value.rewards.items():  # a NaN here would poison the sample's score
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return ToolResult(f"error: {name} returned reward signal {signal!r} = {value!r}, not a finite "
                                  "number", error=True)
        return outcome.value

    def close(self) -> None:
        self.pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
