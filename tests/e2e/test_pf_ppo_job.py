"""PF-PPO in a whole PPO job (GAE with a critic) on the tiny model: with ``reweight_method = "pow"`` a
sample scored 0 keeps only the floor weight, so the resampled batch the update trains on holds rewarded
samples alone wherever the step had any; the plain job's batch holds both."""

from __future__ import annotations

from tests.e2e.conftest import job_overrides, parity_reward, read_metrics, train

PPO = ["algorithm.adv_estimator=gae", "rollout.n=2"]
QUIET = {"trainer.val_before_train": False, "trainer.test_freq": -1, "trainer.save_freq": -1,
         "trainer.total_training_steps": 2}


def test_pf_ppo_trains_on_the_rewarded_samples_drawn_again(tiny_model, gsm8k_parquet, tmp_path):
    plain = train(*job_overrides(tiny_model, gsm8k_parquet, tmp_path / "plain", **QUIET), *PPO,
                  *parity_reward(tmp_path), timeout=120)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    filtered = train(*job_overrides(tiny_model, gsm8k_parquet, tmp_path / "pf", **QUIET), *PPO,
                     *parity_reward(tmp_path), "algorithm.use_pf_ppo=true", "algorithm.pf_ppo.reweight_method=pow",
                     timeout=120)
    assert filtered.returncode == 0, filtered.stdout + filtered.stderr
    plain_steps, pf_steps = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "pf")
    # the same samples before the draw (the same seeds): the plain batch mixes scores 0 and 1
    assert all(0.0 < m["critic/score/mean"] < 1.0 for m in plain_steps), [m["critic/score/mean"] for m in plain_steps]
    for before, after in zip(plain_steps, pf_steps, strict=True):
        assert after["critic/score/mean"] == 1.0  # only rewarded samples drawn
        assert 0.0 < after["pf_ppo/distinct_samples"] <= before["critic/score/mean"] + 1e-6
        assert "pf_ppo/distinct_samples" not in before
