"""``[profiler]`` (docs/profiling.md) on whole jobs: the traced step's trace and summary beside the run, what
the summary says checked against the trace itself, nothing learned changed; and the colocated form, whose
trainer and engine share one device, traced in both processes."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.e2e.conftest import job_overrides, read_metrics, train
from tests.e2e.test_async import RAY_TIMEOUT_S, async_job

GRPO = ["algorithm.adv_estimator=grpo", "rollout.n=2"]
QUIET = {"trainer.val_before_train": False, "trainer.test_freq": -1, "trainer.save_freq": -1}
LEARNED = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean", "response_length/mean")


def trace_events(path) -> list[dict]:
    with gzip.open(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def test_a_traced_step_leaves_its_trace_and_summary_and_changes_nothing_learned(tiny_model, gsm8k_parquet, tmp_path):
    steps = {"trainer.total_training_steps": 3}
    plain = train(*job_overrides(tiny_model, gsm8k_parquet, tmp_path / "plain", **(QUIET | steps)), *GRPO, timeout=120)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    traced = train(*job_overrides(tiny_model, gsm8k_parquet, tmp_path / "traced", **(QUIET | steps)), *GRPO,
                   "profiler.steps=[2]", timeout=120)
    assert traced.returncode == 0, traced.stdout + traced.stderr

    folder = tmp_path / "traced" / "profile"
    assert sorted(p.name for p in folder.iterdir()) == ["step_2"]  # only the step named
    assert sorted(p.name for p in (folder / "step_2").iterdir()) == ["hybrid_rank0.pt.trace.json.gz", "summary.json"]
    summary = json.loads((folder / "step_2" / "summary.json").read_text())
    assert summary["step"] == 2 and summary["shared_devices"] == []  # one process: nothing shares its device
    (process,) = summary["processes"]
    assert process["process"] == "hybrid_rank0" and process["device"] is None  # the CPU: no device kernels
    cpu = process["cpu"]
    assert 0 < cpu["busy_s"] <= process["window_s"]
    assert cpu["busy_s"] + cpu["idle_s"] == pytest.approx(process["window_s"], abs=1e-4)
    # the step's work is in the trace: the update's matrix products, the engine's sampling
    names = {e["name"] for e in trace_events(folder / "step_2" / "hybrid_rank0.pt.trace.json.gz")
             if e.get("cat") == "cpu_op"}
    assert {"aten::mm", "aten::multinomial"} <= names or {"aten::addmm", "aten::multinomial"} <= names, sorted(names)[:40]
    assert {top["name"] for top in cpu["top"]} <= names
    # the worker's phases: the host's time in each, and the operators it ran meanwhile
    phases = process["phases"]
    assert {"generate", "update_actor"} <= set(phases), phases
    for name, times in phases.items():
        assert 0 < times["host_s"] <= process["window_s"] and times["cpu_busy_s"] <= times["host_s"] + 1e-6, name
    assert sum(times["host_s"] for times in phases.values()) <= process["window_s"] + 1e-6
    line = next(line for line in traced.stdout.splitlines() if line.startswith("profile step 2:"))
    assert "hybrid_rank0 cpu busy" in line and str(folder / "step_2") in line

    for a, b in zip(read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "traced"), strict=True):
        for key in LEARNED:
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-8), (a["step"], key)


@pytest.mark.slow
def test_the_colocated_trainer_and_engine_are_traced_side_by_side(tiny_model, gsm8k_parquet, tmp_path):
    run = tmp_path / "colocated"
    result = train(*async_job(tiny_model, gsm8k_parquet, run, "colocated", 1, **{"trainer.total_training_steps": 3}),
                   "profiler.steps=[2]", f"profiler.dir={tmp_path / 'traces'}", ray=True, timeout=RAY_TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    step = tmp_path / "traces" / "step_2"
    assert sorted(p.name for p in step.iterdir()) == [
        "rollout_rank0.pt.trace.json.gz", "summary.json", "trainer_rank0.pt.trace.json.gz"]
    summary = json.loads((step / "summary.json").read_text())
    processes = {p["process"]: p for p in summary["processes"]}
    assert set(processes) == {"trainer_rank0", "rollout_rank0"}
    # the engine generated the next batch in its own thread while the trainer trained: both did work
    assert all(p["cpu"]["busy_s"] > 0 for p in processes.values())
    # ... in the phases each process marks: the engine's generation, the trainer's update
    assert "generate" in processes["rollout_rank0"]["phases"] and "update_actor" in processes["trainer_rank0"]["phases"]
    (shared,) = summary["shared_devices"]  # on the CPU both share the machine's cores
    assert shared["processes"] == ["rollout_rank0", "trainer_rank0"] and shared["activity"] == "cpu operators"
    assert shared["all_busy_s"] <= min(p["cpu"]["busy_s"] for p in processes.values()) + 1e-6
    assert shared["any_busy_s"] + shared["none_busy_s"] == pytest.approx(shared["window_s"], abs=1e-4)
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3]
