"""Multi-turn GRPO jobs through the real CLI, FSDP2 and the hf engine: with the calculator on GSM8K-format
data made by ``rlcore data gsm8k --tools calculator``, and with the python tool and the code reward on
HumanEval-format data. The policy is a tiny model whose generations are set in its weights
(``tests.engine_models.build_tool_using_model``): its first turn calls the tool, and its second turn
answers only if the call ran and the tool's result came back into the conversation, so the job's
outputs, tool metrics and scores are known in advance."""

import json
import os

import pytest

from tests.conftest import run_rlcore
from tests.data.test_humaneval import PROBLEMS
from tests.e2e.conftest import job_overrides, read_metrics, train
from tests.engine_models import build_tool_using_model

TIMEOUT_S = 60  # each job's deadline: 2 steps took 8 to 10 s in the job's own process on the idle CI machine

CALCULATOR_CALL = '{"name": "calculator", "arguments": {"expression": "111*111"}}'
ANSWER = "The answer is #### 12321"
# one code block that solves every HumanEval-format problem of tests/data/test_humaneval.py
SOLUTIONS = ("```python\ndef total(numbers):\n    return sum(numbers)\n\n\ndef is_even(n):\n    return n % 2 == 0\n"
             "\n\ndef double(x):\n    return 2 * x\n```")
PYTHON_CALL = '{"name": "python", "arguments": {"code": "print(111 * 111)"}}'
MULTI_TURN = ["rollout.multi_turn.enable=true", "rollout.multi_turn.max_turns=2"]


@pytest.fixture(scope="module")
def calculator_model(tmp_path_factory):
    return build_tool_using_model(tmp_path_factory.mktemp("models") / "calculator", CALCULATOR_CALL, "12321", ANSWER)


@pytest.fixture(scope="module")
def python_model(tmp_path_factory):
    return build_tool_using_model(tmp_path_factory.mktemp("models") / "python", PYTHON_CALL, "12321", SOLUTIONS)


def calculator_data(tmp_path):
    """GSM8K-format problems, half of them 111 * 111 (answer 12321), half 12 * 3 (36), through
    ``rlcore data gsm8k --tools calculator``: 16 train and 4 test rows."""
    source = tmp_path / "source"
    source.mkdir()
    for split, count in (("train", 16), ("test", 4)):
        problems = [{"question": "What is 111 * 111?", "answer": "111 * 111 = 12321\n#### 12321"} if i % 2 == 0 else
                    {"question": "What is 12 * 3?", "answer": "12 * 3 = 36\n#### 36"} for i in range(count)]
        (source / f"{split}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    made = run_rlcore("data", "gsm8k", "--input", str(source), "--tools", "calculator",
                      "--local-save-dir", str(tmp_path / "data"))
    assert made.returncode == 0, made.stderr
    return tmp_path / "data"


def generations(run) -> dict[int, list[dict]]:
    return {int(path.stem): [json.loads(line) for line in path.read_text().splitlines()]
            for path in sorted((run / "generations").glob("*.jsonl"))}


def assert_one_call_ran_per_conversation(step: dict, conversations: int) -> None:
    """Every conversation: two turns, one well-formed call that ran without error, then the answer."""
    assert step["num_turns/min"] == step["num_turns/max"] == 2, step
    assert step["tool_call_counts/min"] == step["tool_call_counts/max"] == 1, step
    assert step["tool_calls/total"] == conversations and step["tool_calls/well_formed_rate"] == 1.0, step
    assert step["tool_calls/malformed"] == step["tool_calls/errors"] == step["tool_calls/timeouts"] == 0, step
    assert step["agent_loop/tool_calls/min"] > 0 and step["timing_s/tools"] > 0, step  # seconds in the calls


def assert_the_calculator_ran_and_the_answers_scored(run, metrics: list[dict]) -> None:
    """A 2-step job of 4 prompts x 2 samples on ``calculator_data`` with ``calculator_model``, its
    generations in ``run/generations``: every conversation called the calculator once, read 12321 and
    answered, and each sample scored what rlcore/gsm8k_tools gives for that answer."""
    assert [m["step"] for m in metrics] == [1, 2]
    written = generations(run)
    assert sorted(written) == [1, 2]
    for step in metrics:
        assert_one_call_ran_per_conversation(step, conversations=4 * 2)
        records = written[step["step"]]
        # the model's text of both turns (tool messages are not the model's): the call, then the
        # answer it writes only with the result 12321 in the conversation
        assert all(r["output"] == f"<tool_call>{CALCULATOR_CALL}</tool_call>{ANSWER}" for r in records), records
        # rlcore/gsm8k_tools: 1 for the right answer after ####, plus 0.1 for a well-formed call
        expected = [1.1 if r["gts"] == "12321" else 0.1 for r in records]
        assert [r["score"] for r in records] == pytest.approx(expected), records
        assert [r["tool_call"] for r in records] == [1.0] * len(records)
        assert step["critic/score/mean"] == pytest.approx(sum(expected) / len(expected))


def test_multi_turn_grpo_job_with_hf_calls_the_calculator_and_scores_the_answer(calculator_model, tmp_path):
    run = tmp_path / "multi_turn"
    result = train(*job_overrides(calculator_model, calculator_data(tmp_path), run, **{
        "data.max_response_length": 48, "trainer.save_freq": -1, "trainer.test_freq": 2,
        "trainer.val_before_train": False, "trainer.rollout_data_dir": str(run / "generations")}),
        "algorithm.adv_estimator=grpo", "rollout.n=2",
        "actor_rollout_ref.rollout.multi_turn.enable=true",  # verl's keys
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        'actor_rollout_ref.rollout.multi_turn.tools=["calculator"]',
        "data.max_prompt_length=1024", timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    assert_the_calculator_ran_and_the_answers_scored(run, metrics)
    assert metrics[1]["val-core/rlcore/gsm8k_tools/acc/mean@1"] == pytest.approx(0.5)  # 2 of the 4 are 12321


@pytest.mark.skipif(os.geteuid() != 0, reason="the code reward's sandbox needs root (as in CI)")
def test_humaneval_job_with_the_python_tool_and_code_reward_runs_with_hf(python_model, tmp_path):
    """HumanEval-format data through ``rlcore data humaneval``, the python tool (in the sandbox) and the
    code reward (scored in the sandbox, through the reward workers): the model runs a script, reads its
    output, then writes code that passes every test case."""
    problems = [dict(p, task_id=f"HumanEval/{i}") for i, p in enumerate(PROBLEMS * 3)]  # 9 problems
    (tmp_path / "HumanEval.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    data = tmp_path / "data"
    made = run_rlcore("data", "humaneval", "--input", str(tmp_path / "HumanEval.jsonl"), "--test-every", "3",
                      "--local-save-dir", str(data))
    assert made.returncode == 0, made.stderr
    run = tmp_path / "humaneval"
    result = train(*job_overrides(python_model, data, run, **{
        "data.max_response_length": 48, "data.max_prompt_length": 1536, "trainer.save_freq": -1,
        "trainer.test_freq": 2, "trainer.val_before_train": False}),
        "algorithm.adv_estimator=grpo", "rollout.n=2", *MULTI_TURN, 'rollout.multi_turn.tools=["python"]',
        timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    for step in metrics:
        assert_one_call_ran_per_conversation(step, conversations=4 * 2)
        # every test case of every problem passes in the sandbox ("fraction" scoring), none timed out
        assert step["critic/score/mean"] == 1.0 and step["reward/timeouts"] == 0, step
    assert metrics[1]["val-core/openai/openai_humaneval/acc/mean@1"] == 1.0
    assert metrics[1]["val-aux/openai/openai_humaneval/has_code/mean@1"] == 1.0
