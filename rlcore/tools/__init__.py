"""Tools a model may call during a multi-turn rollout, registered by plugins (``rlcore_register_tools``).

A tool is a name, an OpenAI-style JSON schema of its arguments, and an ``execute(arguments)`` that
returns a ``ToolResult``: the text the model sees next, and optional reward signals. The controller
runs tools in worker processes of their own (``rlcore.tools.runner``), never in a training process,
with a timeout per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen
class ToolResult:
    text: str
    rewards: dict[str, float] = attrs.field(factory=dict)  # named signals, e.g. {"tests_passed": 0.5}
    error: bool = False  # the call failed (bad arguments, code that raised, a timeout)


@attrs.frozen
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    execute: Callable[[dict[str, Any]], ToolResult]  # a module-level function: worker processes import it
    timeout_s: float = 10.0

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling schema, as chat templates' ``tools=`` take it."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}
