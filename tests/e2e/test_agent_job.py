"""Whole GRPO jobs whose episodes are driven by agent programs through the OpenAI-compatible endpoint, with
the hf engine in the job's own process (``trainer.ray = false``): the example plugin's calculator agent
(plugins/rlcore-example, written with the ``openai`` package) and a test agent that rewrites its history.
The policy is a tiny model whose generations are set in its weights
(``tests.engine_models.build_tool_using_model``): it calls the calculator, and answers once the result
12321 is in the conversation, so every episode's calls, tokens and scores are known in advance."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.conftest import REPO, run_rlcore
from tests.e2e.conftest import job_overrides, read_metrics, train
from tests.engine_models import build_tool_using_model

pytest.importorskip("openai", reason="the agents are written with the openai package")

TIMEOUT_S = 120  # each job's deadline: 2 steps take about 15 s in the job's own process on an idle 2-core machine
CALCULATOR_CALL = '{"name": "calculator", "arguments": {"expression": "111*111"}}'
ANSWER = "The answer is #### 12321"

REWRITING_AGENT = '''"""rlcore test plugin (tests/e2e/test_agent_job.py): an agent that starts its conversation over."""

from rlcore.api import Agent, hookimpl


async def rewriting(episode, client):
    first = await client.chat.completions.create(model="m", messages=episode.prompt)
    # the second call drops the first exchange: its prompt does not extend the first call's tokens
    again = [{"role": "user", "content": "Once more: " + episode.prompt[-1]["content"]}]
    await client.chat.completions.create(model="m", messages=again)
    return 1.0 if episode.sample == 0 else 0.0  # a reward of its own, not the reward function's


@hookimpl
def rlcore_register_agents(register):
    register("test/rewriting", Agent(rewriting))
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
    """The example plugin and the test agent, each a package with an entry point of group ``rlcore``."""
    site = tmp_path_factory.mktemp("agent-site")
    os.symlink(REPO / "plugins" / "rlcore-example" / "rlcore_example", site / "rlcore_example")
    (site / "rlcore_test_agents.py").write_text(REWRITING_AGENT)
    for dist, name, module in (("rlcore_example-0.1.0", "example", "rlcore_example"),
                               ("rlcore_test_agents-0.0", "test-agents", "rlcore_test_agents")):
        (site / f"{dist}.dist-info").mkdir()
        (site / f"{dist}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist.split('-')[0]}\nVersion: {dist.split('-')[1]}\n")
        (site / f"{dist}.dist-info" / "entry_points.txt").write_text(f"[rlcore]\n{name} = {module}\n")
    return site


def agent_job(policy, data, run, agent: str, site) -> list[dict]:
    overrides = job_overrides(policy, data, run, **{
        "rollout.agent.name": agent, "rollout.agent.record_dir": str(run / "episodes"),
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
    metrics = agent_job(policy, data, run, "example/calculator", site)
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


def test_a_history_rewriting_agent_trains_on_one_row_per_call(policy, data, site, tmp_path):
    """The rewriting agent's two calls do not extend each other: 2 rows per episode, each trained on its
    own call's output, the episode's reward (the agent's own: 1 for the first sample, 0 for the second)
    on both; every episode counted in agent/non_extending_episodes."""
    run = tmp_path / "run"
    metrics = agent_job(policy, data, run, "test/rewriting", site)
    for step in metrics[1:]:
        assert step["agent/non_extending_episodes"] == 8 and step["agent/rows"] == 16, step
        assert step["agent/returned_reward"] == 8 and step["critic/score/mean"] == 0.5, step
        # a prompt's group is its 4 rows: two scored 1, two 0; GRPO: (1 - 0.5) / std([1, 1, 0, 0]) = 0.5 / sqrt(1/3)
        assert step["critic/advantages/max"] == pytest.approx(0.5 / (1 / 3) ** 0.5, abs=1e-4), step
        assert step["agent/engine_calls"] == 2, step  # the 8 episodes' first calls in one engine call, then the second
    for episode in episodes(run, "1"):
        assert not episode["extending"] and episode["reward"] == (1.0 if episode["sample"] == 0 else 0.0)
        assert [row["response_ids"] for row in episode["rows"]] == [call["output_ids"] for call in episode["calls"]]
        assert [row["prompt_ids"] for row in episode["rows"]] == [call["prompt_ids"] for call in episode["calls"]]
        assert all(row["loss_mask"] == [1] * len(row["response_ids"]) for row in episode["rows"])
        assert [row["log_probs"] for row in episode["rows"]] == [call["log_probs"] for call in episode["calls"]]
