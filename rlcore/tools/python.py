"""The ``python`` tool: runs the model's code in the sandbox and returns what it printed."""

from __future__ import annotations

from rlcore.sandbox import SandboxLimits, run_code
from rlcore.tools import Tool, ToolResult

LIMITS = SandboxLimits(timeout_s=10.0, cpu_seconds=5, max_output_bytes=16 * 1024)
SHOWN = 2000  # characters of output the model reads back


def execute(arguments: dict) -> ToolResult:
    code = arguments.get("code")
    if not isinstance(code, str):
        return ToolResult("error: the python tool takes {\"code\": \"<python source>\"}", error=True)
    result = run_code(code, LIMITS)
    text = result.stdout
    if result.exit_code != 0:
        text += result.stderr[-SHOWN:]
    if result.timed_out:
        text += f"\n[killed: over {LIMITS.timeout_s:g} s]"
    if result.output_truncated:
        text += "\n[killed: too much output]"
    return ToolResult(text[-SHOWN:] or "(no output)", error=not result.ok)


PYTHON = Tool(
    name="python",
    description="Run a Python 3 script (standard library only, no network, no files kept) and return "
                "what it prints. Use print() to see values.",
    parameters={"type": "object", "properties": {"code": {"type": "string", "description": "the script"}},
                "required": ["code"]},
    execute=execute,
    timeout_s=LIMITS.timeout_s + 5.0,
)
