"""Multi-turn GRPO jobs on a tiny model, through the real CLI, FSDP2 and the hf engine: with the
calculator on GSM8K, and with the python tool and the code reward on HumanEval-format data. The
machinery runs end to end (the scripted policy in tests/rollout proves the calls)."""

import json
import os

import pytest

from tests.conftest import run_rlcore
from tests.data.test_humaneval import PROBLEMS
from tests.e2e.conftest import job_overrides, read_metrics, train

TIMEOUT_S = 60  # each job's deadline: 2 steps took 8 to 10 s in the job's own process on the idle CI machine


def test_multi_turn_grpo_job_runs_with_hf(tiny_model, gsm8k_parquet, tmp_path):
    run = tmp_path / "multi_turn"
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run, **{
        "data.max_response_length": 24, "trainer.save_freq": -1, "trainer.test_freq": -1,
        "trainer.val_before_train": False}),
        "algorithm.adv_estimator=grpo", "rollout.n=2",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        'actor_rollout_ref.rollout.multi_turn.tools=["calculator"]',
        "data.max_prompt_length=1024", timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    for name in ("num_turns/min", "num_turns/max", "num_turns/mean", "tool_calls/total", "tool_calls/malformed",
                 "tool_calls/errors", "timing_s/tools", "actor/pg_loss", "critic/score/mean"):
        assert name in metrics[0], name
    assert 1 <= metrics[0]["num_turns/min"] <= metrics[0]["num_turns/max"] <= 2


@pytest.mark.skipif(os.geteuid() != 0, reason="the code reward's sandbox needs root (as in CI)")
def test_humaneval_job_with_the_python_tool_and_code_reward_runs_with_hf(tiny_model, tmp_path):
    """HumanEval-format data through ``rlcore data humaneval``, the python tool and the code reward
    (scored in the sandbox, through the reward workers): the job runs and validates."""
    problems = [dict(p, task_id=f"HumanEval/{i}") for i, p in enumerate(PROBLEMS * 3)]  # 9 problems
    (tmp_path / "HumanEval.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    data = tmp_path / "data"
    made = run_rlcore("data", "humaneval", "--input", str(tmp_path / "HumanEval.jsonl"), "--test-every", "3",
                      "--local-save-dir", str(data))
    assert made.returncode == 0, made.stderr
    run = tmp_path / "humaneval"
    result = train(*job_overrides(tiny_model, data, run, **{
        "data.max_response_length": 24, "data.max_prompt_length": 1536, "trainer.save_freq": -1,
        "trainer.test_freq": 2, "trainer.val_before_train": False}),
        "algorithm.adv_estimator=grpo", "rollout.n=2",
        "rollout.multi_turn.enable=true", "rollout.multi_turn.max_turns=2", 'rollout.multi_turn.tools=["python"]',
        timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    # a random model writes no code: every response scored 0, by the reward function, not by an error
    assert metrics[0]["critic/score/mean"] == 0 and metrics[0]["reward/timeouts"] == 0
    assert metrics[1]["val-core/openai/openai_humaneval/acc/mean@1"] == 0
    assert "val-aux/openai/openai_humaneval/has_code/mean@1" in metrics[1]
