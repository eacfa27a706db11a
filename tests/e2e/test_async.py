"""The asynchronous mode (docs/async.md): whole jobs on the tiny model, split and colocated."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import job_overrides, read_metrics, start_train, train
from tests.processes import kill_family, wait_or_fail

GRPO = ["algorithm.adv_estimator=grpo", "rollout.n=2"]
QUIET = {"trainer.val_before_train": False, "trainer.test_freq": -1, "trainer.save_freq": -1}
LOSSES = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean", "response_length/mean")


def async_job(tiny_model, gsm8k_parquet, run, mode: str, staleness: int, **extra) -> list[str]:
    return job_overrides(tiny_model, gsm8k_parquet, run, **(QUIET | extra)) + GRPO + [
        f'async_training.mode="{mode}"', f"async_training.max_staleness={staleness}"]


def test_split_staleness_zero_gives_the_losses_of_lockstep(tiny_model, gsm8k_parquet, tmp_path):
    steps = {"trainer.total_training_steps": 3}
    lockstep = train(*job_overrides(tiny_model, gsm8k_parquet, tmp_path / "sync", **(QUIET | steps)), *GRPO)
    assert lockstep.returncode == 0, lockstep.stdout + lockstep.stderr
    split = train(*async_job(tiny_model, gsm8k_parquet, tmp_path / "split", "split", 0, **steps))
    assert split.returncode == 0, split.stdout + split.stderr
    assert "workers: 1 rollout (hf engine, devices of their own)" in split.stdout
    assert "workers: 1 trainer (actor)" in split.stdout
    sync_metrics, split_metrics = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "split")
    assert [m["step"] for m in split_metrics] == [1, 2, 3]
    for a, b in zip(sync_metrics, split_metrics, strict=True):
        assert b["async/staleness_max"] == 0 and b["async/policy_version"] == a["step"] - 1
        for key in LOSSES:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)
        assert b["async/weight_sync_s"] > 0 and b["async/weight_sync_gb"] > 0
