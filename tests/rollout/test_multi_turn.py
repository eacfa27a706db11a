"""Multi-turn rollouts through the real controller (``Trainer._rollout``: generate, tools, score) with a
scripted policy: a fake engine that writes known tool calls, so the masks, turns and rewards are known."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlcore import hookimpl
from rlcore.batch import Batch
from rlcore.config import load_job
from rlcore.plugins.manager import PluginManager
from rlcore.rollout.multi_turn import MULTI_TURN_METRICS, TOOL_REWARDS
from rlcore.rollout.outputs import response_rows
from rlcore.testing import build_tiny_model
from rlcore.tools import Tool, ToolResult
from rlcore.tools.format import HERMES_SYSTEM, parse_tool_calls

QUESTIONS = {  # prompt -> (ground truth, assistant turns, tool calls, malformed, score)
    "What is 6 times 7?": ("42", 2, 1, 0, 1.0),
    "Say 5 directly.": ("5", 1, 0, 0, 1.0),
    "This one is broken: 3?": ("3", 2, 0, 1, 1.0),
    "Loop on 1 + 1 forever.": ("9", 3, 3, 0, 0.0),
    "Chat about 6 by 7.": ("42", 2, 1, 0, 1.0),  # goes on after its call: cut there, the eos added
}
IMAGINED = " The calculator says 99, so #### 99. Anything else?"


def script(context: str) -> str:
    """The scripted policy's next assistant message, given the conversation so far."""
    question = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", context)[-1]
    tool_answers = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", context, re.DOTALL)
    if "times" in question:
        if not tool_answers:
            return '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
        return f"The calculator says #### {tool_answers[-1]}"
    if "directly" in question:
        return "#### 5"
    if "Chat" in question:
        if not tool_answers:
            return '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>' + IMAGINED
        return f"#### {tool_answers[-1]}"
    if "grade" in question:  # the grader tool signals rewards
        if not tool_answers:
            return '<tool_call>{"name": "grader", "arguments": {"answer": "5"}}</tool_call>'
        return "#### 5"
    if "broken" in question:
        return '<tool_call>{"name": "calculator", "arguments": {oops</tool_call>' if not tool_answers else "#### 3"
    return '<tool_call>{"name": "calculator", "arguments": {"expression": "1 + 1"}}</tool_call>'


class ScriptedWorkers:
    """Stands in for the worker group: ``dispatch("generate")`` runs the scripted policy."""

    world_size = 1

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = []

    def dispatch(self, method, prompts, sampling):
        assert method == "generate" and sampling.n == 1  # one continuation per conversation and turn
        self.calls.append(len(prompts))
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        contexts = [self.tokenizer.decode(ids[mask.bool()]) for ids, mask in
                    zip(prompts["input_ids"], prompts["attention_mask"])]
        responses = [self.tokenizer.encode(script(c), add_special_tokens=False) + [eos] for c in contexts]
        log_probs = [[-0.5] * len(r) for r in responses]
        return response_rows(prompts["input_ids"], prompts["attention_mask"], responses, log_probs,
                             sampling.max_new_tokens, pad)


def make_trainer(tmp_path, questions: dict, *overrides: str, plugins=None):
    from rlcore.trainer import Trainer

    model = build_tiny_model(tmp_path / "model")
    rows = [{"data_source": "rlcore/arithmetic", "prompt": [{"role": "user", "content": q}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"index": i}}
            for i, (q, (truth, *_)) in enumerate(questions.items())]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    manager = PluginManager(plugins=plugins)  # the installed backends too: the job names fsdp
    job = load_job(None, [f"model.path={model}", f"data.train_files={tmp_path / 'train.parquet'}",
                          f"data.train_batch_size={len(questions)}", "data.shuffle=false",
                          "data.max_response_length=600", "rollout.n=2", "algorithm.adv_estimator=grpo",
                          f"actor.ppo_mini_batch_size={len(questions)}",
                          f"trainer.default_local_dir={tmp_path / 'run'}",
                          "actor_rollout_ref.rollout.multi_turn.enable=true",
                          "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
                          'rollout.multi_turn.tools=["calculator"]', *overrides], manager=manager)
    trainer = Trainer(job, manager, echo=lambda *_: None)
    trainer.workers = ScriptedWorkers(trainer.tokenizer)
    return trainer


@pytest.fixture
def trainer(tmp_path):
    trainer = make_trainer(tmp_path, QUESTIONS)
    yield trainer
    trainer.multi_turn.close()


def test_scripted_policy_drives_tool_calls_through_the_controller(trainer):
    tokenizer = trainer.tokenizer
    batch = trainer._rollout(trainer.loader.next_batch(), trainer.sampling_params())
    assert len(batch) == 10  # 5 prompts x n = 2
    # every turn of every conversation advanced together: 10 rows, then 8 (two answered at once), then 2
    assert trainer.workers.calls == [10, 8, 2]
    for row in range(len(batch)):
        question = batch["raw_prompt"][row][-1]["content"]
        truth, turns, calls, malformed, score = QUESTIONS[question]
        assert batch["ground_truth"][row] == truth
        assert batch["num_turns"][row] == turns and batch["tool_calls"][row] == calls
        assert batch["score"][row] == score
        real = batch["attention_mask"][row, batch["prompts"].shape[1]:].bool()  # (R,) every response token
        loss = batch["response_mask"][row].bool()  # (R,) model tokens only
        tokens = batch["responses"][row]
        model_text = tokenizer.decode(tokens[loss])
        tool_text = tokenizer.decode(tokens[real & ~loss])
        # the model's turns are in the loss; the tool messages (and the template's glue) are not
        cut = "Chat" in question
        assert model_text.count("<|im_end|>") == turns - cut and "<|im_start|>" not in model_text
        assert tool_text.count("<|im_start|>tool") == turns - 1
        if "times" in question:
            assert "<|im_start|>tool\n42<|im_end|>" in tool_text and model_text.endswith("#### 42<|im_end|>")
        if "broken" in question:
            assert "malformed tool call" in tool_text
        if cut:  # what it wrote after the call is gone; the eos that closes its turn is outside the loss
            assert IMAGINED.strip() not in tokenizer.decode(tokens[real]) and "99" not in model_text
            assert tool_text.startswith("<|im_end|>\n<|im_start|>tool\n42<|im_end|>")
            assert model_text.endswith("</tool_call>#### 42<|im_end|>")
        # rollout log-probs only on model tokens
        assert torch.all(batch["rollout_log_probs"][row][loss] == -0.5)
        assert torch.all(batch["rollout_log_probs"][row][~loss] == 0)
        # the score sits on the last model token
        last = int(loss.nonzero().max())
        assert batch["token_level_scores"][row, last] == score
        assert batch["token_level_scores"][row].sum() == score
    metrics = batch.meta[MULTI_TURN_METRICS]
    assert metrics["num_turns/min"] == 1 and metrics["num_turns/max"] == 3 and metrics["num_turns/mean"] == 2.0
    assert metrics["tool_calls/total"] == 2 * (1 + 3 + 1) and metrics["tool_calls/malformed"] == 2
    assert (metrics["tool_call_counts/min"], metrics["tool_call_counts/max"], metrics["tool_call_counts/mean"]) == (
        0, 3, 1.0)
    assert metrics["agent_loop/tool_calls/min"] == 0 < metrics["agent_loop/tool_calls/max"] <= metrics["timing_s/tools"]
    assert metrics["tool_calls/well_formed_rate"] == 0.6  # "times", "loop" and "Chat" called well
    assert metrics["tool_calls/errors"] == 0 and metrics["timing_s/tools"] > 0


def test_tools_go_into_the_system_prompt_when_the_template_ignores_them(trainer):
    prompt = trainer.tokenizer.decode(trainer.multi_turn.prompt_ids([{"role": "user", "content": "hi"}]))
    assert prompt.startswith("<|im_start|>system\n# Tools") and '"name": "calculator"' in prompt
    assert HERMES_SYSTEM.splitlines()[0] in prompt and prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("text,calls,malformed", [
    ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>', [("a", {"x": 1})], 0),
    ('x <tool_call>\n{"name": "a", "arguments": "{\\"x\\": 2}"}\n</tool_call> y <tool_call>{"name": "b"}</tool_call>',
     [("a", {"x": 2}), ("b", {})], 0),
    ('<tool_call>{"name": "a", "arguments": {</tool_call>', [], 1),
    ('<tool_call>[1, 2]</tool_call><tool_call>{"arguments": {}}</tool_call>', [], 2),
    ('<tool_call>{"name": "a", "arguments": {}}', [], 1),
    ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', [], 1),
    ("no calls here", [], 0),
    ("<tool_call>" + "[" * 100000 + "</tool_call>", [], 1),
])
def test_tool_call_parser_counts_malformed_calls(text, calls, malformed):
    parsed = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == calls and parsed.malformed == malformed


def grade(arguments):
    return ToolResult("graded", rewards={"checked": 0.25, "bonus": 0.5 if arguments.get("answer") == "5" else 0.0})


class GraderPlugin:
    @hookimpl
    def rlcore_register_tools(self, register):
        register("grader", Tool("grader", "grades an answer", {"type": "object"}, grade))


@pytest.mark.parametrize("mode", ["add", "report"])
def test_tool_reward_signals_reach_the_score_as_configured(tmp_path, mode):
    questions = {"Please grade 5.": ("5", 2, 1, 0, 1.0), "Say 5 directly.": ("5", 1, 0, 0, 1.0)}
    trainer = make_trainer(tmp_path, questions, 'rollout.multi_turn.tools=["calculator", "grader"]',
                           f"rollout.multi_turn.tool_rewards={mode}", plugins={"grader": GraderPlugin()})
    try:
        batch = trainer._rollout(trainer.loader.next_batch(), trainer.sampling_params())
    finally:
        trainer.multi_turn.close()
    graded = ["grade" in batch["raw_prompt"][row][-1]["content"] for row in range(len(batch))]
    assert graded == [True, True, False, False]
    # the reward function pays 1.0 for "#### 5"; one grader call signals checked 0.25 and bonus 0.5
    expected_tool = [0.75 if g else 0.0 for g in graded]
    assert batch["tool_reward"] == expected_tool
    assert batch[TOOL_REWARDS] == [{"checked": 0.25, "bonus": 0.5}] * 2 + [{}] * 2
    expected = [1.0 + t for t in expected_tool] if mode == "add" else [1.0] * 4
    assert batch["score"] == expected
    assert batch["token_level_scores"].sum(-1).tolist() == expected
    metrics = batch.meta["reward_metrics"]
    assert metrics["tool_reward/mean"] == pytest.approx(0.375)
    assert metrics["tool_reward/checked/mean"] == pytest.approx(0.125)
    assert metrics["tool_reward/bonus/mean"] == pytest.approx(0.25)


@pytest.mark.parametrize("text,tags", [
    ('a <tool_call>{}</tool_call> b', 1),
    ('<tool_call>{}</tool_call>\n <tool_call>{}</tool_call> then <tool_call>{}</tool_call>', 2),  # the first run
    ('<tool_call>{} never closed', 0), ("no calls", 0),
])
def test_first_call_run_counts_the_consecutive_blocks(text, tags):
    from rlcore.tools.format import first_call_run

    assert first_call_run(text) == tags
