"""Whole GRPO jobs whose episodes are driven by agent programs through the OpenAI-compatible endpoint, with
the hf engine in the job's own process (``trainer.ray = false``): the example plugin's calculator agent
(plugins/rlcore-example, written with the ``openai`` package) and an external agent program that rewrites its
history (``rollout.agent.command``: one process per episode, its reward written back to ``RLCORE_RESULT``).
The policy is a tiny model whose generations are set in its weights
(``tests.engine_models.build_tool_using_model``): it calls the calculator, and answers once the result
12321 is in the conversation, so every episode's calls, tokens and scores are known in advance."""

from __future__ import annotations

import json
import os
import shlex
import sys

import pytest
import torch

from tests.conftest import REPO, run_rlcore
from tests.e2e.conftest import job_overrides, read_metrics, train
from tests.engine_models import build_tool_using_model

pytest.importorskip("openai", reason="the agents are written with the openai package")

TIMEOUT_S = 120  # each job's deadline: 2 steps take about 15 s in the job's own process on an idle 2-core machine
CALCULATOR_CALL = '{"name": "calculator", "arguments": {"expression": "111*111"}}'
ANSWER = "The answer is #### 12321"

REWRITING_PROGRAM = '''"""rlcore test agent program (tests/e2e/test_agent_job.py): an agent that starts its conversation
over. It speaks HTTP with the standard library (any client will do; importing openai would cost each
process about 0.7 s of CPU, tests/agents/test_programs.py runs programs written with it)."""

import json
import os
import urllib.request


def chat(messages):
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                     data=json.dumps({"model": "m", "messages": messages}).encode(),
                                     headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["choices"][0]["message"]["content"]


episode = json.load(open(os.environ["RLCORE_EPISODE"]))
chat(episode["prompt"])
# the second call drops the first exchange: its prompt does not extend the first call's tokens
chat([{"role": "user", "content": "Once more: " + episode["prompt"][-1]["content"]}])
# a reward of its own, not the reward function's
json.dump({"reward": 1.0 if episode["sample"] == 0 else 0.0}, open(os.environ["RLCORE_RESULT"], "w"))
'''


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return build_tool_using_model(tmp_path_factory.mktemp("models") / "calculator", CALCULATOR_CALL, "12321", ANSWER)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """GSM8K-format problems made by ``rlcore data gsm8k``: half 111 * 111 (12321), half 12 * 3 (36)."""
    root = tmp_path_factory.mktemp("agent-data")
    source = root / "source"
    source.mkdir()
    for split, count in (("train", 16), ("test", 4)):
        problems = [{"question": "What is 111 * 111?", "answer": "111 * 111 = 12321\n#### 12321"} if i % 2 == 0 else
                    {"question": "What is 12 * 3?", "answer": "12 * 3 = 36\n#### 36"} for i in range(count)]
        (source / f"{split}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    made = run_rlcore("data", "gsm8k", "--input", str(source), "--local-save-dir", str(root / "data"))
    assert made.returncode == 0, made.stderr
    return root / "data"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The example plugin, a package with an entry point of group ``rlcore``."""
    site = tmp_path_factory.mktemp("agent-site")
    os.symlink(REPO / "plugins" / "rlcore-example" / "rlcore_example", site / "rlcore_example")
    for dist, name, module in (("rlcore_example-0.1.0", "example", "rlcore_example"),):
        (site / f"{dist}.dist-info").mkdir()
        (site / f"{dist}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist.split('-')[0]}\nVersion: {dist.split('-')[1]}\n")
        (site / f"{dist}.dist-info" / "entry_points.txt").write_text(f"[rlcore]\n{name} = {module}\n")
    return site


def agent_job(policy, data, run, site, **agent: str) -> list[dict]:
    """A 2-step job whose episodes the ``agent`` keys (``rollout.agent.name`` or ``command``) drive."""
    overrides = job_overrides(policy, data, run, **{f"rollout.agent.{k}": v for k, v in agent.items()}, **{
        "rollout.agent.record_dir": str(run / "episodes"),
        "rollout.agent.batch_wait_s": 5.0,  # a call waits for every running episode's (they all come at once)
        "algorithm.adv_estimator": "grpo", "rollout.n": 2, "rollout.calculate_log_probs": True,
        "data.max_prompt_length": 1024, "data.max_response_length": 64, "trainer.save_freq": 0})
    result = train(*overrides, timeout=TIMEOUT_S, site=site)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return read_metrics(run)


def episodes(run, label: str) -> list[dict]:
    return [json.loads(line) for line in (run / "episodes" / f"{label}.jsonl").read_text().splitlines()]


def engine_log_probs(model_path, prompt: list[int], output: list[int]) -> list[float]:
    """The output's log-probs at temperature 1 from a plain transformers forward of the initial weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


def test_the_example_calculator_agent_trains_two_steps(policy, data, site, tmp_path):
    """Every episode: the policy calls the calculator, the agent runs it and sends 12321 back, the policy
    answers; one row per episode whose mask covers exactly the engine's tokens of both calls, with the
    engine's log-probs; the 111 * 111 episodes score 1, the 12 * 3 ones 0."""
    from transformers import AutoTokenizer

    run = tmp_path / "run"
    metrics = agent_job(policy, data, run, site, name="example/calculator")
    assert [m["step"] for m in metrics] == [0, 1, 2]  # validation before training, then 2 steps
    assert metrics[0]["val-core/openai/gsm8k/reward/mean@1"] == 0.5
    for step in metrics[1:]:
        assert step["agent/episodes"] == step["agent/rows"] == 8 and step["agent/errors"] == 0, step
        assert step["agent/calls/min"] == step["agent/calls/max"] == 2 and step["agent/non_extending_episodes"] == 0
        assert step["critic/score/mean"] == 0.5, step  # a prompt's two episodes agree: GRPO's advantages are 0
    assert metrics[-1]["val-core/openai/gsm8k/reward/mean@1"] == 0.5
    tokenizer = AutoTokenizer.from_pretrained(policy)
    for label in ("val_0", "1", "2", "val_2"):
        for episode in episodes(run, label):
            assert episode["status"] == "ok" and episode["answer"] == ANSWER and episode["extending"]
            first, second = episode["calls"]
            assert tokenizer.decode(first["output_ids"]) == f"<tool_call>{CALCULATOR_CALL}</tool_call><|im_end|>"
            assert tokenizer.decode(second["output_ids"]) == f"{ANSWER}<|im_end|>"
            [row] = episode["rows"]
            assert row["prompt_ids"] == first["prompt_ids"]
            between = second["prompt_ids"][len(first["prompt_ids"]) + len(first["output_ids"]):]
            assert tokenizer.decode(between) == "\n<|im_start|>tool\n12321<|im_end|>\n<|im_start|>assistant\n"
            assert row["response_ids"] == first["output_ids"] + between + second["output_ids"]
            assert row["loss_mask"] == [1] * len(first["output_ids"]) + [0] * len(between) + [1] * len(
                second["output_ids"])
            assert row["log_probs"] == first["log_probs"] + [0.0] * len(between) + second["log_probs"]
    for episode in episodes(run, "1"):  # step 1 generates with the initial weights: a plain forward agrees
        for call in episode["calls"]:
            assert call["log_probs"] == pytest.approx(engine_log_probs(policy, call["prompt_ids"], call["output_ids"]),
                                                      abs=1e-4)


def test_a_history_rewriting_agent_program_trains_on_one_row_per_call(policy, data, site, tmp_path):
    """The rewriting agent, an external program (rollout.agent.command, a process per episode): its two
    calls do not extend each other: 2 rows per episode, each trained on its own call's output, the
    episode's reward (the program's own, written back: 1 for the first sample, 0 for the second) on both;
    every episode counted in agent/non_extending_episodes."""
    run = tmp_path / "run"
    (tmp_path / "rewriting_agent.py").write_text(REWRITING_PROGRAM)
    metrics = agent_job(policy, data, run, site, command=shlex.join([sys.executable, str(tmp_path / "rewriting_agent.py")]))
    for step in metrics[1:]:
        assert step["agent/non_extending_episodes"] == 8 and step["agent/rows"] == 16, step
        assert step["agent/returned_reward"] == 8 and step["critic/score/mean"] == 0.5, step
        assert step["agent/exit_failures"] == step["agent/errors"] == step["agent/timeouts"] == 0, step
        # a prompt's group is its 4 rows: two scored 1, two 0; GRPO: (1 - 0.5) / std([1, 1, 0, 0]) = 0.5 / sqrt(1/3)
        assert step["critic/advantages/max"] == pytest.approx(0.5 / (1 / 3) ** 0.5, abs=1e-4), step
        assert step["agent/engine_calls"] == 2, step  # the 8 episodes' first calls in one engine call, then the second
    for episode in episodes(run, "1"):
        assert not episode["extending"] and episode["reward"] == (1.0 if episode["sample"] == 0 else 0.0)
        assert [row["response_ids"] for row in episode["rows"]] == [call["output_ids"] for call in episode["calls"]]
        assert [row["prompt_ids"] for row in episode["rows"]] == [call["prompt_ids"] for call in episode["calls"]]
        assert all(row["loss_mask"] == [1] * len(row["response_ids"]) for row in episode["rows"])
        assert [row["log_probs"] for row in episode["rows"]] == [call["log_probs"] for call in episode["calls"]]
