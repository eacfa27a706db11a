"""The OpenAI wire format the endpoint speaks: requests checked against the job's sampling settings,
errors as OpenAI writes them (``{"error": {"message", "type", "param", "code"}}``), and response bodies.

The job's sampling settings govern every call: a request may leave ``temperature``, ``top_p``, ``n`` and
``max_tokens`` out or ask for what the job uses (a smaller ``max_tokens`` too); asking for anything else
is an error naming the field, so that what trains is what the job says it samples.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import attrs

from rlcore.tools.format import parse_tool_calls


class RequestError(Exception):
    """A request the endpoint refuses: an OpenAI-style error body with HTTP ``status``."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@attrs.frozen
class JobSampling:
    """What the job samples with in training (``rollout.*``) and the longest response it trains on."""

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int  # data.max_response_length


@attrs.frozen
class CallRequest:
    """A checked request: what to render and how many tokens it may generate."""

    kind: str  # "chat" or "completion"
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    prompt: str | list[int] | None = None
    max_tokens: int = 0
    logprobs: bool = False


# Fields of the OpenAI API the endpoint cannot honour: refused unless absent or at the neutral value.
_NEUTRAL = {"stream": (False, None), "stop": (None, [], ""), "presence_penalty": (0, 0.0, None),
            "frequency_penalty": (0, 0.0, None), "logit_bias": (None, {}), "best_of": (None, 1),
            "echo": (False, None), "suffix": (None, ""), "top_logprobs": (None, 0),
            "response_format": (None, {"type": "text"}), "tool_choice": (None, "auto"),
            "functions": (None, []), "function_call": (None, "auto"), "prediction": (None,)}
_WHY = {"stream": "responses come whole (streaming is not supported yet)",
        "stop": "stop sequences would cut the engine's output; the job trains on what the engine generated",
        "tool_choice": "the model chooses its tool calls itself ('auto')",
        "functions": "use tools (the model family's tool-call format)",
        "function_call": "use tools (the model family's tool-call format)"}


def check_request(body: Any, kind: str, job: JobSampling) -> CallRequest:
    """The request ``body`` of ``/v1/chat/completions`` (``kind = "chat"``) or ``/v1/completions``,
    checked; a ``RequestError`` naming the first field the job does not allow."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for field, neutral in _NEUTRAL.items():
        if field in body and body[field] not in neutral:
            why = _WHY.get(field, "the endpoint does not support it")
            raise RequestError(f"{field} = {body[field]!r} is not supported: {why}", param=field)
    for field, value in (("temperature", job.temperature), ("top_p", job.top_p)):
        if body.get(field) is not None and not _same(body[field], value):
            raise RequestError(f"{field} = {body[field]!r}: this endpoint samples with the training job's "
                               f"{field} = {value} (rollout.{field}); leave {field} out or set it to {value}",
                               param=field)
    if body.get("top_k") is not None and body["top_k"] != job.top_k:
        raise RequestError(f"top_k = {body['top_k']!r}: the training job samples with top_k = {job.top_k} "
                           "(rollout.top_k); leave it out", param="top_k")
    if body.get("n") not in (None, 1):
        raise RequestError(f"n = {body['n']!r}: one choice per request (the job runs rollout.n episodes per "
                           "prompt instead)", param="n")
    max_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    asked = body.get(max_field)
    if asked is not None and (not isinstance(asked, int) or isinstance(asked, bool) or asked < 1):
        raise RequestError(f"{max_field} = {asked!r}: expected a positive integer", param=max_field)
    if asked is not None and asked > job.max_tokens:
        raise RequestError(f"{max_field} = {asked} is larger than the training job's responses "
                           f"(data.max_response_length = {job.max_tokens}); ask for at most {job.max_tokens}",
                           param=max_field)
    logprobs = body.get("logprobs")
    if kind == "completion":
        if logprobs not in (None, 0, False):
            raise RequestError("logprobs: the completions endpoint returns no log-probs; use /v1/chat/completions "
                               "with logprobs = true", param="logprobs")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # one prompt, as some clients send it
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                            and all(isinstance(i, int) for i in prompt))):
            raise RequestError("prompt must be one string or one list of token ids", param="prompt")
        return CallRequest("completion", prompt=prompt, max_tokens=asked or job.max_tokens)
    if logprobs not in (None, False, True):
        raise RequestError(f"logprobs = {logprobs!r}: expected true or false", param="logprobs")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of chat messages", param="messages")
    tools = body.get("tools") or None
    if tools is not None:
        _check_tools(tools)
    return CallRequest("chat", messages=[_plain_message(m, i) for i, m in enumerate(messages)], tools=tools,
                       max_tokens=asked or job.max_tokens, logprobs=bool(logprobs))


def _same(asked, value: float) -> bool:
    return isinstance(asked, (int, float)) and not isinstance(asked, bool) and abs(float(asked) - value) < 1e-9


def _check_tools(tools) -> None:
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of function tools", param="tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict) \
                or not isinstance(tool["function"].get("name"), str):
            raise RequestError(f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ..., "
                               "'parameters': {...}}}}", param=f"tools[{i}]")


def _plain_message(message: Any, index: int) -> dict:
    """A chat message as the chat template takes it: role, text content, tool calls with parsed
    arguments; a ``RequestError`` naming the message for what no text template can show (images)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RequestError(f"{where} must be an object with a role", param=where)
    role, content = message["role"], message.get("content")
    if role == "developer":
        role = "system"  # OpenAI's newer name for the system message
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"{where}.content: only text parts are supported, got {kind!r}",
                                   param=f"{where}.content")
            texts.append(part["text"])
        content = "".join(texts)
    if content is not None and not isinstance(content, str):
        raise RequestError(f"{where}.content must be text", param=f"{where}.content")
    plain = {"role": role, "content": content or ""}
    calls = message.get("tool_calls")
    if calls:
        plain["tool_calls"] = [_plain_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(calls)]
    if role == "tool" and message.get("tool_call_id") is not None:
        plain["tool_call_id"] = message["tool_call_id"]
    if role == "tool" and message.get("name") is not None:
        plain["name"] = message["name"]
    return plain


def _plain_call(call: Any, where: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(f"{where}: expected {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}",
                           param=where)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise RequestError(f"{where}.function.arguments is not JSON", param=f"{where}.function.arguments") from None
    return {"id": call.get("id"), "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def same_message(asked: dict, recorded: dict) -> bool:
    """Whether a message of a request is the one the episode's transcript holds (tool call ids aside,
    which templates do not render)."""
    def key(m: dict):
        calls = [(c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
                 for c in m.get("tool_calls", ())]
        return m["role"], m["content"], calls, m.get("name")
    return key(asked) == key(recorded)


# --- response bodies ----------------------------------------------------------------------------------


def assistant_message(text: str, with_tools: bool) -> tuple[dict, str | None]:
    """The assistant message of a generated ``text`` (its ``<tool_call>`` blocks as ``tool_calls``
    where the request offered tools), and the finish reason that the calls imply (or None)."""
    if not with_tools:
        return {"role": "assistant", "content": text}, None
    parsed = parse_tool_calls(text)
    if not parsed.calls:
        return {"role": "assistant", "content": text}, None
    rest = text
    while "<tool_call>" in rest and "</tool_call>" in rest:
        start, end = rest.index("<tool_call>"), rest.index("</tool_call>") + len("</tool_call>")
        rest = rest[:start] + rest[end:]
    calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
              "function": {"name": call.name, "arguments": json.dumps(call.arguments)}} for call in parsed.calls]
    return {"role": "assistant", "content": rest.strip() or None, "tool_calls": calls}, "tool_calls"


def chat_body(model: str, message: dict, finish: str, prompt_tokens: int, completion_tokens: int,
              logprobs: list[dict] | None) -> dict:
    choice = {"index": 0, "message": message, "finish_reason": finish,
              "logprobs": None if logprobs is None else {"content": logprobs}}
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}


def completion_body(model: str, text: str, finish: str, prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
            "usage": usage(prompt_tokens, completion_tokens)}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def token_logprobs(tokenizer, ids: list[int], log_probs: list[float]) -> list[dict]:
    """OpenAI's ``logprobs.content``: each generated token's text and log-prob (no alternatives)."""
    out = []
    for token_id, value in zip(ids, log_probs):
        text = tokenizer.decode([token_id])
        out.append({"token": text, "logprob": value, "bytes": list(text.encode("utf-8")), "top_logprobs": []})
    return out
