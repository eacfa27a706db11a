"""``benchmarks/async_modes.py``: a run that fails or passes its deadline is reported with the steps it
finished and the end of its log, and the benchmark goes on to the next run (on the GPU machine a 1.5B run
past its deadline once stopped the whole sitting and lost the runs after it)."""

import json
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import async_modes  # noqa: E402


def test_a_failing_run_says_why_and_the_benchmark_goes_on(tmp_path, capsys):
    metrics, stopped = async_modes.run("lockstep", ["examples/gsm8k_grpo_smollm2.toml",
                                                    "data.train_files=['/nowhere/train.parquet']"], tmp_path, 120)
    assert metrics == [] and stopped.startswith("failed:")
    printed = capsys.readouterr().out
    assert "lockstep: failed" in printed and "/nowhere/train.parquet" in printed  # rlcore's own reason, from the log
    row = async_modes.summarize(metrics, 512, (), stopped)
    assert row["s/step"] is None and row["steps"] == 0 and row["stopped"] == stopped


def test_a_run_past_its_deadline_keeps_the_steps_it_finished(tmp_path, monkeypatch):
    def past_deadline(command, timeout_s, **kwargs):  # the job wrote two steps, then ran out of time
        folder = tmp_path / "colocated"
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "timing_s/step": 10.0 + s}) + "\n"
                                                      for s in (1, 2)))
        raise async_modes.RanPastDeadline("ran past")

    monkeypatch.setattr(async_modes, "run_bounded", past_deadline)
    metrics, stopped = async_modes.run("colocated", [], tmp_path, 30)
    assert stopped == "killed at 30 s" and [m["step"] for m in metrics] == [1, 2]
    row = async_modes.summarize(metrics, 512, (), stopped)
    assert row["s/step"] == pytest.approx(12.0) and row["steps"] == 2 and row["stopped"] == "killed at 30 s"
    assert async_modes.step_times(metrics) == {1: 11.0, 2: 12.0}  # each step kept in the results file too


def test_every_phase_of_the_later_steps_is_kept_as_its_median():
    metrics = [{"step": 1, "timing_s/step": 30.0, "timing_s/reward": 9.0},
               {"step": 2, "timing_s/step": 4.0, "timing_s/reward": 0.2, "timing_s/adv": 0.01},
               {"step": 3, "timing_s/step": 5.0, "timing_s/reward": 0.4, "actor/pg_loss": 1.0},
               {"step": 4, "timing_s/step": 9.0, "timing_s/reward": 3.0}]  # traced: left out
    phases = async_modes.phase_medians(metrics, traced=(4,))
    assert phases == {"timing_s/adv": 0.01, "timing_s/reward": 0.3, "timing_s/step": 4.5}


def test_traced_steps_after_the_last_step_are_dropped_with_a_note(capsys):
    assert async_modes.traceable_steps([4], 3) == []
    assert "steps [4] come after the last of 3 steps; no trace" in capsys.readouterr().out
    assert async_modes.traceable_steps([2, 4], 3) == [2]
    assert async_modes.traceable_steps([2, 4], 12) == [2, 4]
    assert capsys.readouterr().out.count("come after") == 1


def test_every_planned_run_is_a_valid_job_when_the_overrides_give_the_colocated_form_two_engines():
    """``EXTRA=async_training.engines_per_device=2`` goes to every run of a sitting's pair; lockstep has one
    engine, in the trainer's process, so its run sets one (its record names what ran) and keeps the other
    overrides."""
    from types import SimpleNamespace

    from rlcore.config import load_job

    args = SimpleNamespace(modes=["off", "colocated"], staleness=[1], correction=["is"], sharing=[None],
                           split_overrides=[])
    base = ["examples/gsm8k_grpo_smollm2.toml", "async_training.engines_per_device=2", "actor.use_torch_compile=true"]
    runs = dict(async_modes.planned_runs(args, base))
    assert set(runs) == {"lockstep", "colocated-staleness1"}
    for name, overrides in runs.items():
        config = load_job(str(REPO / overrides[0]), overrides[1:]).config
        assert config.actor.use_torch_compile
        assert config.section("async_training").engines_per_device == (1 if name == "lockstep" else 2)


def test_each_steps_phases_are_kept_so_that_alternating_steps_show_which_side_they_waited_for():
    """A 1.5B run's steps alternated between ~10 and ~16 s (2026-12-07) and the results kept only medians."""
    metrics = [{"step": 2, "timing_s/step": 9.9123, "timing_s/gen": 0.01, "timing_s/gen/engine": 14.0,
                "timing_s/ref": 2.0, "actor/pg_loss": 1.0},
               {"step": 3, "timing_s/step": 16.2, "timing_s/gen": 6.1, "timing_s/gen/engine": 16.0}]
    assert async_modes.step_phases(metrics) == {
        2: {"s/step": 9.912, "gen wait": 0.01, "engine": 14.0, "ref": 2.0},
        3: {"s/step": 16.2, "gen wait": 6.1, "engine": 16.0}}
