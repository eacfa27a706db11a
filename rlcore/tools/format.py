"""The tool-call format: schemas into the prompt, ``<tool_call>`` blocks out of the response.

Hermes / Qwen style, the format most open chat models are tuned on. Where the chat template
renders ``apply_chat_template(..., tools=...)`` itself (Qwen2.5, Hermes, Llama 3.1), it is used;
where it ignores ``tools`` (SmolLM2's, the tiny test model's), the schemas are rendered into the
system prompt as ``HERMES_SYSTEM`` below. The model answers a call as::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "3 * 4"}}
    </tool_call>
"""

from __future__ import annotations

import json
import re

import attrs

from rlcore.errors import RlcoreError
from rlcore.tools.runner import ToolCall

HERMES_SYSTEM = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{schemas}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_CALL_RUN = re.compile(r"<tool_call>.*?</tool_call>(?:\s*<tool_call>.*?</tool_call>)*", re.DOTALL)


@attrs.frozen
class ParsedCalls:
    calls: list[ToolCall]
    malformed: int  # <tool_call> blocks that are not {"name": str, "arguments": object}, or unclosed


def parse_tool_calls(text: str) -> ParsedCalls:
    """The well-formed calls of a response, and how many blocks were malformed (never an exception)."""
    calls, malformed = [], 0
    for body in _CALL.findall(text):
        call = _call(body)
        if call is None:
            malformed += 1
        else:
            calls.append(call)
    closed_end = text.rfind("</tool_call>")
    if text.find("<tool_call>", closed_end if closed_end >= 0 else 0) > closed_end:  # opened, never closed
        malformed += 1
    return ParsedCalls(calls, malformed)


def first_call_run(text: str) -> int:
    """How many ``</tool_call>`` tags close the first run of consecutive call blocks (0: no closed call)."""
    match = _CALL_RUN.search(text)
    return match.group(0).count("</tool_call>") if match else 0


def _call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body.strip())
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], arguments)


def template_renders_tools(tokenizer) -> bool:
    """Whether the chat template shows ``tools=`` (it renders differently with and without them)."""
    messages = [{"role": "user", "content": "hi"}]
    probe = [{"type": "function", "function": {"name": "probe_tool_xyz", "description": "",
                                               "parameters": {"type": "object", "properties": {}}}}]
    try:
        with_tools = tokenizer.apply_chat_template(messages, tools=probe, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that fails on tools does not support them
        return False
    return "probe_tool_xyz" in with_tools


def system_prompt(schemas: list[dict]) -> str:
    return HERMES_SYSTEM.format(schemas="\n".join(json.dumps(s) for s in schemas))


def with_tools(messages: list[dict], schemas: list[dict], in_system_prompt: bool) -> list[dict]:
    """``messages`` with the tool schemas in the system prompt (merged into an existing one)."""
    if not in_system_prompt or not schemas:
        return list(messages)
    text = system_prompt(schemas)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


class ToolTurns:
    """Token ids of tool messages as the chat template renders them between two assistant turns:
    whatever closes the assistant turn after its eos, the tool message(s), and the opening of the
    next assistant turn. Found by rendering a fixed conversation with and without them."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        rendered = tokenizer.apply_chat_template(self._base, tokenize=False)
        self._prefix = rendered
        after_answer = rendered[rendered.rindex("a") + 1:]
        eos = tokenizer.eos_token or ""
        # the model's turn ends at its eos token; the template may add more after it (ChatML: "\n")
        self._closing = after_answer.split(eos, 1)[1] if eos and eos in after_answer else ""

    def ids(self, contents: list[str]) -> list[int]:
        rendered = self.tokenizer.apply_chat_template(
            self._base + [{"role": "tool", "content": c} for c in contents], tokenize=False,
            add_generation_prompt=True)
        if not rendered.startswith(self._prefix):
            raise RlcoreError("the chat template renders earlier turns differently once a tool message follows; "
                              "multi-turn rollouts need a template that appends turns")
        return self.tokenizer.encode(self._closing + rendered[len(self._prefix):], add_special_tokens=False)
