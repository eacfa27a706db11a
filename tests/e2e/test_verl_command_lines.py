"""verl's quickstart command lines (the PPO line and the GRPO line the tutorials derive from it, as
issue 31 gives them: ``benchmarks/verl_jobs.py`` holds their text) under ``rlcore train`` instead of
``python3 -m verl.trainer.main_ppo``, on a tiny model with the hf engine.

Only the keys the issue lets change are changed: the model and data paths, ``trainer.total_training_steps``
(``trainer.total_epochs=15`` stays), ``data.train_batch_size`` with ``ppo_mini_batch_size`` (4 and 4:
a share of a mini-batch must stay a multiple of the lines' ``ppo_micro_batch_size_per_gpu=4``). Besides:
``actor_rollout_ref.rollout.name=hf`` (CI has no vLLM) and ``trainer.default_local_dir`` (where the run
writes, so the test can read it). ``save_freq=10`` and ``test_freq=10`` stay: as in verl, the last step
also saves and validates.
"""

from __future__ import annotations

import math
import sys

from tests.conftest import REPO
from tests.e2e.conftest import read_metrics, train

sys.path.insert(0, str(REPO / "benchmarks"))
import verl_jobs  # noqa: E402


def line(job: str, model, data, run) -> list[str]:
    overrides = verl_jobs.line_overrides(job, model, data / "train.parquet", data / "test.parquet", 2, batch=4, mini=4,
                                         timed=False)
    return verl_jobs.with_overrides(overrides, ["actor_rollout_ref.rollout.name=hf", f"trainer.default_local_dir={run}"])


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def test_verls_ppo_line(tiny_model, gsm8k_parquet, tmp_path):
    run = tmp_path / "ppo"
    overrides = line("ppo-line", tiny_model, gsm8k_parquet, run)
    assert "algorithm.use_kl_in_reward=True" in overrides and "trainer.total_epochs=15" in overrides
    result = train(*overrides, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "critic: on" in result.stdout  # verl's default estimator is gae
    assert "is refused" not in result.stdout + result.stderr
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]  # total_training_steps=2 stops before the 15 epochs
    for m in metrics:
        # the KL penalty in the reward is applied (its coefficient the line's kl_ctrl.kl_coef) and the critic trains
        assert finite(m["actor/reward_kl_penalty"]) and m["actor/reward_kl_penalty_coeff"] == 0.001
        assert finite(m["critic/vf_loss"]) and "actor/kl_loss" not in m
    # step 2 is the last: validated and saved (test_freq=10, save_freq=10, as verl does at the last step)
    assert "val-core/openai/gsm8k/reward/mean@1" in metrics[-1]
    assert sorted(p.name for p in run.glob("global_step_*")) == ["global_step_2"]


def test_verls_grpo_line(tiny_model, gsm8k_parquet, tmp_path):
    run = tmp_path / "grpo"
    overrides = line("grpo-line", tiny_model, gsm8k_parquet, run)
    assert not any(o.startswith("critic.") for o in overrides)
    result = train(*overrides, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "critic: on" not in result.stdout
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert finite(m["actor/kl_loss"]) and "actor/reward_kl_penalty" not in m  # KL as a loss, not in the reward
        assert "critic/vf_loss" not in m
    assert "val-core/openai/gsm8k/reward/mean@1" in metrics[-1]
