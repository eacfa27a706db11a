"""An episode's calls as the engine saw them, and the training rows they become.

Each call records the prompt ids fed to the engine and the ids and log-probs the engine returned;
nothing is tokenized again afterwards. A chat request whose messages begin with the episode's
conversation so far (the earlier messages and the assistant messages as the endpoint returned them)
is fed the earlier call's very tokens, followed by the new messages as the chat template renders them
after an assistant turn; so an agent that appends to its history extends the transcript token for
token, and its episode is one row: the first prompt, then the model's tokens (trained) and everything
between them (tool results, user turns: masked). Where a call's prompt does not extend the one before
it plus its output (an agent that rewrites, trims or reorders its history), every call of the episode
becomes a row of its own.
"""

from __future__ import annotations

import json

import attrs

from rlcore.agents.protocol import CallRequest, same_message
from rlcore.tools.format import template_renders_tools, with_tools


@attrs.frozen
class Call:
    prompt_ids: list[int]  # what the engine was fed
    output_ids: list[int]  # what it generated (through its eos, or cut at the call's max_tokens)
    log_probs: list[float] | None  # the engine's, one per output id (None: the engine returned none)
    finish: str  # "stop" or "length"


@attrs.frozen
class Row:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]  # 1: a token the engine generated; 0: anything else (tool results, user turns)
    log_probs: list[float]  # the engine's on generated tokens, 0 elsewhere


@attrs.define
class Transcript:
    """What the endpoint recorded of one episode."""

    first_prompt: list[int]  # the dataset prompt's ids: the row of an episode that made no call
    calls: list[Call] = attrs.Factory(list)
    messages: list[dict] | None = None  # the conversation through the last chat call's answer
    tools: list[dict] | None = None  # the tools of the last chat call
    text: str | None = None  # the last completion call's prompt and completion, as text
    last_text: str = ""  # the last call's generated text (scored when the agent returns None)
    refused: int = 0  # requests answered with an error
    in_flight: int = 0  # calls waiting for the engine
    reserved: int = 0  # the tokens those calls may generate

    @property
    def generated(self) -> int:
        """Tokens the engine generated for this episode, over all its calls."""
        return sum(len(call.output_ids) for call in self.calls)

    @property
    def tokens(self) -> list[int]:
        """The last call's prompt and output: what a next call's prompt extends."""
        last = self.calls[-1]
        return last.prompt_ids + last.output_ids

    def extends(self, prompt_ids: list[int]) -> bool:
        return bool(self.calls) and prompt_ids[:len(self.tokens)] == self.tokens

    def room(self, prompt_ids: list[int], max_response: int) -> int:
        """Tokens this call may generate so that the episode's row stays within ``max_response``."""
        if not self.extends(prompt_ids):
            return max_response  # the first call, or one that starts a row of its own
        return max_response - (len(prompt_ids) - len(self.calls[0].prompt_ids))

    def record(self, call: Call, text: str, request: CallRequest, answer: dict | None) -> None:
        self.calls.append(call)
        self.last_text = text
        if request.kind == "chat":
            self.messages, self.tools, self.text = [*request.messages, answer], request.tools, None
        else:
            prompt = request.prompt if isinstance(request.prompt, str) else None
            self.messages, self.tools = None, None
            self.text = None if prompt is None else prompt + text

    # -- prompts ------------------------------------------------------------------------------------
    def chat_prompt(self, request: CallRequest, renderer: ChatRenderer) -> list[int]:
        """The prompt ids of a chat request: the transcript's tokens and the new messages where the
        request continues the recorded conversation, else the whole conversation rendered."""
        known = self.messages
        if (known is not None and self.calls and request.tools == self.tools and len(request.messages) > len(known)
                and all(same_message(a, b) for a, b in zip(request.messages, known))):
            return self.tokens + renderer.continuation(self.calls[-1].output_ids, request.messages[len(known):],
                                                       request.tools)
        return renderer.conversation(request.messages, request.tools)

    def completion_prompt(self, request: CallRequest, tokenizer) -> list[int]:
        if not isinstance(request.prompt, str):
            return list(request.prompt)  # token ids, as given
        if self.text is not None and self.calls and request.prompt.startswith(self.text):
            return self.tokens + tokenizer.encode(request.prompt[len(self.text):], add_special_tokens=False)
        return tokenizer.encode(request.prompt)

    # -- rows ---------------------------------------------------------------------------------------
    def extending(self) -> bool:
        """Every call's prompt extends the call before it (its prompt and output) token for token."""
        return all(later.prompt_ids[:len(earlier.prompt_ids) + len(earlier.output_ids)]
                   == earlier.prompt_ids + earlier.output_ids for earlier, later in zip(self.calls, self.calls[1:]))

    def rows(self, max_response: int, per_call: bool) -> list[Row]:
        """The training rows: one for an extending episode (or an episode without calls), else one per
        call (``per_call``) or only the last call's (validation scores the episode once)."""
        if not self.calls:
            return [Row(list(self.first_prompt), [], [], [])]
        if self.extending():
            first = self.calls[0]
            response, mask, log_probs = [], [], []
            end = len(first.prompt_ids)
            for call in self.calls:
                between = call.prompt_ids[end:]
                response += between + call.output_ids
                mask += [0] * len(between) + [1] * len(call.output_ids)
                log_probs += [0.0] * len(between) + _log_probs(call)
                end = len(call.prompt_ids) + len(call.output_ids)
            if len(response) <= max_response:
                return [Row(list(first.prompt_ids), response, mask, log_probs)]
        calls = self.calls if per_call else self.calls[-1:]
        return [Row(list(c.prompt_ids), list(c.output_ids), [1] * len(c.output_ids), _log_probs(c)) for c in calls]

    def to_record(self) -> dict:
        return {"calls": [attrs.asdict(c) for c in self.calls], "extending": self.extending(), "refused": self.refused}


def _log_probs(call: Call) -> list[float]:
    return list(call.log_probs) if call.log_probs is not None else [0.0] * len(call.output_ids)


class ChatRenderer:
    """Chat messages into prompt ids through the model family's chat template, with its tool format
    where it has one (``apply_chat_template(tools=...)``), else the Hermes format that rlcore's multi-turn
    rollouts use: the tool schemas in the system prompt, the calls as ``<tool_call>`` blocks."""

    def __init__(self, tokenizer, eos_ids: list[int]):
        self.tokenizer, self.eos_ids = tokenizer, set(eos_ids)
        self.native_tools = template_renders_tools(tokenizer)
        self.native_calls = template_renders_tool_calls(tokenizer)
        self._base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]

    def _render(self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool, tokenize: bool):
        messages = [self._templated(m) for m in messages]
        if tools and not self.native_tools:
            messages = with_tools(messages, tools, in_system_prompt=True)
        return self.tokenizer.apply_chat_template(messages, tools=tools if self.native_tools else None,
                                                  tokenize=tokenize, add_generation_prompt=generation_prompt,
                                                  return_dict=False)

    def conversation(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        return list(self._render(messages, tools, generation_prompt=True, tokenize=True))

    def continuation(self, last_output: list[int], messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The ids after an assistant turn that ended with ``last_output``: its eos where the engine
        stopped short of one, what the template writes after the eos, the new ``messages`` and the
        opening of the next assistant turn. Found as the text a fixed conversation gains with them."""
        native = tools if self.native_tools else None
        prefix = self._render(self._base, native, generation_prompt=False, tokenize=False)
        full = self._render(self._base + messages, native, generation_prompt=True, tokenize=False)
        if not full.startswith(prefix):  # a template that renders earlier turns anew: no continuation
            return self.conversation(messages, tools)
        after = prefix[prefix.rindex("a") + 1:]
        eos = self.tokenizer.eos_token or ""
        closing = after.split(eos, 1)[1] if eos and eos in after else ""
        ended = bool(last_output) and last_output[-1] in self.eos_ids
        eos_ids = [] if ended or self.tokenizer.eos_token_id is None else [self.tokenizer.eos_token_id]
        return eos_ids + self.tokenizer.encode(closing + full[len(prefix):], add_special_tokens=False)

    def _templated(self, message: dict) -> dict:
        """A message as the template takes it: tool calls inlined as Hermes blocks for a template that
        does not render ``tool_calls``."""
        calls = message.get("tool_calls")
        if not calls:
            return {k: v for k, v in message.items() if k != "tool_calls"}
        if self.native_calls:
            return message
        blocks = "\n".join("<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                                         "arguments": c["function"]["arguments"]}) + "\n</tool_call>"
                           for c in calls)
        content = message["content"]
        return {"role": message["role"], "content": (content + "\n" if content else "") + blocks}


def template_renders_tool_calls(tokenizer) -> bool:
    """Whether the chat template shows an assistant message's ``tool_calls``."""
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "probe_call_xyz", "arguments": {}}}]}]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that fails on tool calls does not render them
        return False
    return "probe_call_xyz" in rendered
