"""Multi-turn rollouts: the model's turns and tool results alternate, up to ``max_turns`` assistant turns.

Engine-agnostic: every turn is one call of the job's ``generate`` (any registered engine) with n = 1 for the
conversations still going, all of them batched together. Between turns the driver parses the
``<tool_call>`` blocks, runs the calls on the ``ToolRunner`` (worker processes, per-call timeouts)
and appends the tool messages as the chat template renders them. The rows it returns are the
single-turn rows every engine returns, with one difference: the response holds model tokens and
tool-result tokens, and ``response_mask`` (the loss and KL mask) is 0 on the tool results;
``attention_mask`` is 1 on both, and ``rollout_log_probs`` are the engine's on model tokens, 0 elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import torch

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.rewards.scorer import RewardResult
from rlcore.rollout.outputs import response_rows
from rlcore.tools import Tool
from rlcore.tools.config import MultiTurnConfig
from rlcore.tools.format import ToolTurns, first_call_run, parse_tool_calls, template_renders_tools, with_tools
from rlcore.tools.runner import ToolCall, ToolRunner
from rlcore.training.roles import SamplingParams, group_seed

# Batch meta key: the multi-turn metrics of one rollout (verl's names), reported by the controller.
MULTI_TURN_METRICS = "multi_turn_metrics"
# Batch row: each conversation's tool reward signals, {signal name: sum over its calls}.
TOOL_REWARDS = "tool_rewards"


@attrs.define
class Conversation:
    prompt: list[int]
    response: list[int] = attrs.Factory(list)
    loss_mask: list[int] = attrs.Factory(list)  # 1: a model token; 0: a tool-result token
    log_probs: list[float] = attrs.Factory(list)
    turns: int = 0
    calls: int = 0
    malformed: int = 0
    errors: int = 0
    tool_seconds: float = 0.0  # in its tool calls (they run in parallel with other conversations')
    done: bool = False
    tool_rewards: dict[str, float] = attrs.Factory(dict)  # each signal summed over the calls
    pending_calls: list = attrs.Factory(list)  # the last model turn's calls, run in the next tool turn
    pending_malformed: int = 0
    close_turn: bool = False  # the last model turn was cut after its calls: the eos goes in, outside the loss


def truncate(text: str, limit: int, side: str) -> str:
    if len(text) <= limit:
        return text
    if side == "left":
        return "..." + text[len(text) - limit:]
    if side == "right":
        return text[:limit] + "..."
    return text[:limit // 2] + "..." + text[len(text) - (limit - limit // 2):]


class MultiTurnRollout:
    """Drives conversations over a ``generate(prompts, sampling) -> rows`` function."""

    def __init__(self, config: MultiTurnConfig, tokenizer, tools: dict[str, Tool], max_response_length: int):
        if not tools:
            raise RlcoreError("rollout.multi_turn.enable needs at least one tool in rollout.multi_turn.tools")
        self.config, self.tokenizer, self.tools = config, tokenizer, tools
        self.max_response_length = max_response_length
        self.schemas = [tool.schema() for tool in tools.values()]
        native = template_renders_tools(tokenizer)
        self.in_system_prompt = {"auto": not native, "always": True, "never": False}[config.system_prompt_tools]
        self.template_tools = self.schemas if native and not self.in_system_prompt else None
        self.tool_turns = ToolTurns(tokenizer)
        self.runner = ToolRunner(tools, config.tool_workers)

    def close(self) -> None:
        self.runner.close()

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The prompt with the tools: in the template's own format, or in the system prompt."""
        return self.tokenizer.apply_chat_template(with_tools(list(messages), self.schemas, self.in_system_prompt),
                                                  tools=self.template_tools, tokenize=True,
                                                  add_generation_prompt=True, return_dict=False)

    def generate(self, prompts: Batch, sampling: SamplingParams,
                 generate: Callable[[Batch, SamplingParams], Batch]) -> Batch:
        rows = prompts.repeat_interleave(sampling.n)
        conversations = [Conversation(list(self.prompt_ids(m))) for m in rows["raw_prompt"]]
        tool_seconds, timeouts = 0.0, 0
        for turn in range(self.config.max_turns):
            active = [c for c in conversations if not c.done]
            if not active:
                break
            self._model_turn(active, sampling, turn, generate)
            pending = [c for c in active if not c.done]
            if turn == self.config.max_turns - 1:  # the last assistant turn: nothing more is run
                for c in pending:
                    c.done = True
                break
            seconds, timed_out = self._tool_turn(pending)
            tool_seconds, timeouts = tool_seconds + seconds, timeouts + timed_out
        return self._rows(conversations, rows, tool_seconds, timeouts)

    # -- turns -----------------------------------------------------------------------------------
    def _model_turn(self, active: list[Conversation], sampling: SamplingParams, turn: int, generate) -> None:
        pad = self.tokenizer.pad_token_id
        contexts = [c.prompt + c.response for c in active]
        width = max(len(ids) for ids in contexts)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in contexts])  # (A, W) left-padded
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in contexts])
        budget = max(self.max_response_length - len(c.response) for c in active)
        seed = None if sampling.seed is None else group_seed(sampling.seed, 10_000 + turn)
        out = generate(Batch({"input_ids": input_ids, "attention_mask": attention}),
                       attrs.evolve(sampling, n=1, max_new_tokens=budget, seed=seed))
        eos_ids = {self.tokenizer.eos_token_id}
        for row, c in enumerate(active):
            keep = out["response_mask"][row].bool()
            new = out["responses"][row][keep].tolist()[:self.max_response_length - len(c.response)]
            lps = (out["rollout_log_probs"][row][keep].tolist()[:len(new)] if "rollout_log_probs" in out
                   else [0.0] * len(new))
            if self.config.stop_at_tool_calls:
                new, lps = self._cut_after_calls(new, lps, eos_ids)
            c.response += new
            c.loss_mask += [1] * len(new)
            c.log_probs += lps
            c.turns += 1
            parsed = parse_tool_calls(self.tokenizer.decode(new, skip_special_tokens=True))
            c.pending_calls, c.pending_malformed = parsed.calls, parsed.malformed
            c.calls += len(parsed.calls)
            c.malformed += parsed.malformed
            ended = bool(new) and new[-1] in eos_ids
            cut = self.config.stop_at_tool_calls and bool(parsed.calls)
            goes_on = (ended and (parsed.calls or parsed.malformed)) or cut
            c.close_turn = cut and not ended
            if not goes_on or len(c.response) >= self.max_response_length:
                c.done = True

    def _cut_after_calls(self, new: list[int], log_probs: list[float], eos_ids: set) -> tuple[list, list]:
        """The turn's tokens up to the end of its first run of tool calls (the model's own eos kept
        where only whitespace comes before it)."""
        decode = self.tokenizer.decode
        tags = first_call_run(decode(new, skip_special_tokens=True))
        if not tags:
            return new, log_probs
        low, high = 1, len(new)  # the shortest prefix that holds every tag of the run
        while low < high:
            middle = (low + high) // 2
            if decode(new[:middle], skip_special_tokens=True).count("</tool_call>") >= tags:
                high = middle
            else:
                low = middle + 1
        rest = new[low:]
        if rest and rest[-1] in eos_ids and not decode(rest, skip_special_tokens=True).strip():
            low = len(new)
        return new[:low], log_probs[:low]

    def _tool_turn(self, pending: list[Conversation]) -> tuple[float, int]:
        """Run every pending conversation's calls together; append the tool messages. Returns the
        seconds spent and the number of calls that timed out."""
        limit = self.config.max_parallel_calls
        batch = [(c, call) for c in pending for call in c.pending_calls[:limit]]
        started = time.monotonic()
        outcomes = self.runner.run([call for _, call in batch])
        seconds = time.monotonic() - started
        answers: dict[int, list[str]] = {id(c): [] for c in pending}
        for (c, _), outcome in zip(batch, outcomes):
            c.errors += outcome.result.error
            c.tool_seconds += outcome.seconds
            for name, value in outcome.result.rewards.items():
                c.tool_rewards[name] = c.tool_rewards.get(name, 0.0) + float(value)
            answers[id(c)].append(truncate(outcome.result.text, self.config.max_tool_response_length,
                                           self.config.tool_response_truncate_side))
        for c in pending:
            extra = len(c.pending_calls) - limit
            if extra > 0:
                answers[id(c)].append(f"error: {extra} call(s) over the limit of {limit} per turn were not run")
                c.errors += extra
            if c.pending_malformed:
                answers[id(c)].append('error: malformed tool call; write <tool_call>{"name": ..., "arguments": '
                                      '{...}}</tool_call>')
            ids = ([self.tokenizer.eos_token_id] if c.close_turn else []) + self.tool_turns.ids(answers[id(c)])
            room = self.max_response_length - len(c.response)
            c.response += ids[:room]
            c.loss_mask += [0] * len(ids[:room])
            c.log_probs += [0.0] * len(ids[:room])
            if len(ids) >= room:  # no room left for another model turn
                c.done = True
        return seconds, sum(o.timed_out for o in outcomes)

    # -- rows ------------------------------------------------------------------------------------
    def _rows(self, conversations: list[Conversation], rows: Batch, tool_seconds: float, timeouts: int) -> Batch:
        pad = self.tokenizer.pad_token_id
        width = max(len(c.prompt) for c in conversations)
        prompt_ids = torch.tensor([[pad] * (width - len(c.prompt)) + c.prompt for c in conversations])  # (B, P)
        prompt_mask = torch.tensor([[0] * (width - len(c.prompt)) + [1] * len(c.prompt) for c in conversations])
        out = response_rows(prompt_ids, prompt_mask, [c.response for c in conversations],
                            [c.log_probs for c in conversations], self.max_response_length, pad)
        loss_mask = torch.zeros_like(out["response_mask"])  # (B, R)
        for row, c in enumerate(conversations):
            loss_mask[row, :len(c.loss_mask)] = torch.tensor(c.loss_mask, dtype=loss_mask.dtype)
        tensors = dict(out.tensors) | {"response_mask": loss_mask,
                                        "rollout_log_probs": out["rollout_log_probs"] * loss_mask}
        turns = torch.tensor([c.turns for c in conversations], dtype=torch.float32)
        counts = torch.tensor([c.calls for c in conversations], dtype=torch.float32)
        seconds = torch.tensor([c.tool_seconds for c in conversations], dtype=torch.float32)
        calls = sum(c.calls for c in conversations)
        metrics = {"num_turns/min": turns.min().item(), "num_turns/max": turns.max().item(),
                   "num_turns/mean": turns.mean().item(),
                   # verl's names: calls per conversation, and seconds in tool calls per conversation
                   "tool_call_counts/min": counts.min().item(), "tool_call_counts/max": counts.max().item(),
                   "tool_call_counts/mean": counts.mean().item(),
                   "agent_loop/tool_calls/min": seconds.min().item(), "agent_loop/tool_calls/max": seconds.max().item(),
                   "agent_loop/tool_calls/mean": seconds.mean().item(),
                   "tool_calls/total": calls,
                   "tool_calls/mean": calls / len(conversations),
                   "tool_calls/malformed": sum(c.malformed for c in conversations),
                   # conversations that called a tool and wrote every <tool_call> block well
                   "tool_calls/well_formed_rate": sum(c.calls > 0 and not c.malformed for c in conversations)
                   / len(conversations),
                   "tool_calls/errors": sum(c.errors for c in conversations),
                   "tool_calls/timeouts": timeouts, "timing_s/tools": tool_seconds}
        extra_rows = {"num_turns": [c.turns for c in conversations],
                      "tool_calls": [c.calls for c in conversations],
                      TOOL_REWARDS: [dict(c.tool_rewards) for c in conversations]}
        return Batch(tensors, extra_rows, {MULTI_TURN_METRICS: metrics})


def with_tool_rewards(result: RewardResult, tool_rewards: list[dict[str, float]], mode: str) -> RewardResult:
    """The scores of a multi-turn batch with its tools' reward signals: per sample, ``tool_reward``
    (the sum of every signal of every call) becomes an extra, and with ``mode = "add"`` is added to
    the score; metrics ``tool_reward/mean`` and ``tool_reward/<signal>/mean`` (0 where absent)."""
    totals = torch.tensor([sum(signals.values()) for signals in tool_rewards], dtype=torch.float32)  # (B,)
    names = sorted({name for signals in tool_rewards for name in signals})
    metrics = {"tool_reward/mean": totals.mean().item() if len(totals) else 0.0}
    for name in names:
        metrics[f"tool_reward/{name}/mean"] = sum(s.get(name, 0.0) for s in tool_rewards) / len(tool_rewards)
    scores = result.scores.float() + totals if mode == "add" else result.scores
    return RewardResult(scores, result.extra | {"tool_reward": totals.tolist()}, result.metrics | metrics,
                        preds=result.preds)


def multi_turn_rollout(config, tokenizer, manager) -> MultiTurnRollout | None:
    """The job's multi-turn driver (``[rollout.multi_turn]``), or None when it is off."""
    section = config.section("rollout.multi_turn")
    if not section.enable:
        return None
    if config.data.apply_chat_template_kwargs:
        raise RlcoreError("data.apply_chat_template_kwargs is not passed to multi-turn rendering yet: leave it "
                          "unset with rollout.multi_turn.enable")
    registry = manager.registry("tools")
    tools = {name: registry.get(name) for name in section.tools}  # an unknown name lists the known ones
    return MultiTurnRollout(section, tokenizer, tools, config.data.max_response_length)
