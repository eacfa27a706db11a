"""A whole GRPO job (KL loss, so the reference runs too) on two workers, through the CLI and Ray,
with Ulysses sequence parallelism 2 against the same job without it: the same samples, the same
losses and gradient norms, step for step."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import job_overrides, read_metrics, train

pytestmark = pytest.mark.slow
COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy",
            "response_length/mean")


def _job(tiny_model, gsm8k_parquet, run_dir, sp: int) -> list[dict]:
    reward = run_dir.parent / "by_length.py"  # scores that differ within a group: the policy moves
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) % 3)\n")
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run_dir, **{
        "trainer.n_gpus_per_node": 2, "trainer.total_training_steps": 2, "trainer.val_before_train": False,
        "trainer.test_freq": -1, "trainer.save_freq": -1, "model.use_remove_padding": True,
        "actor.ppo_mini_batch_size": 4, "rollout.n": 2, "actor.use_kl_loss": True}),
        "algorithm.adv_estimator=grpo", f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
        f"custom_reward_function.path={reward}", ray=True, timeout=120)  # about 19 s under Ray
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"ulysses_sequence_parallel_size = {sp}" in (run_dir / "run.toml").read_text()
    return read_metrics(run_dir)


def test_a_job_with_split_sequences_trains_as_the_job_without(tiny_model, gsm8k_parquet, tmp_path):
    plain = _job(tiny_model, gsm8k_parquet, tmp_path / "sp1", 1)
    split = _job(tiny_model, gsm8k_parquet, tmp_path / "sp2", 2)
    assert len(plain) == len(split) == 2
    for ours, theirs in zip(split, plain):
        for key in COMPARED:
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), (ours["step"], key)
    assert plain[0]["actor/grad_norm"] > 0 and plain[1]["actor/kl_loss"] > 0  # the policy moved off the reference
