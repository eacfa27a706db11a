"""The controller's side (``rlcore.profiling.steps``): only the steps named are traced, in every group;
a step that fails stops the profilers without writing, and its own error is the one raised."""

from __future__ import annotations

import json

import pytest

from rlcore.profiling.config import ProfilerConfig
from rlcore.profiling.steps import StepProfiler
from rlcore.runtime.platforms import CpuPlatform
from rlcore.workers.hybrid import HybridWorker


class InProcessGroup:
    """A worker group's ``call_all`` over real ``HybridWorker`` profiling methods, without models."""

    def __init__(self, name: str, ranks: int, settings: ProfilerConfig):
        self.name, self.calls = name, []
        self.workers = []
        for rank in range(ranks):
            worker = HybridWorker.__new__(HybridWorker)
            worker.rank, worker.config = rank, type("Config", (), {"section": lambda self, key: settings})()
            self.workers.append(worker)

    def call_all(self, method: str, *args) -> list:
        self.calls.append(method)
        return [getattr(worker, method)(*args) for worker in self.workers]

    def submit_all(self, method: str, *args) -> list:
        return self.call_all(method, *args)

    def gather(self, results: list, method: str) -> list:
        return results


@pytest.fixture(autouse=True)
def cpu_platform(monkeypatch):
    monkeypatch.setattr("rlcore.workers.hybrid.current_platform", CpuPlatform)


def test_only_the_steps_named_are_traced_in_the_ranks_chosen(tmp_path):
    settings = ProfilerConfig(steps=(2,), ranks=(1,))
    # one traced process here: torch runs one profiler per process, and each worker is a process of its own
    trainer, engine = InProcessGroup("trainer", 2, settings), InProcessGroup("rollout", 1, settings)
    lines = []
    profiler = StepProfiler(settings, tmp_path, echo=lines.append)
    for step in (1, 2, 3):
        with profiler.around(step, [trainer, engine]):
            sum(i * i for i in range(10_000))
    assert trainer.calls == engine.calls == ["profile_start", "profile_stop"]  # step 2 only
    folder = tmp_path / "profile" / "step_2"
    assert sorted(p.name for p in folder.iterdir()) == ["summary.json", "trainer_rank1.pt.trace.json.gz"]
    summary = json.loads((folder / "summary.json").read_text())
    assert [p["process"] for p in summary["processes"]] == ["trainer_rank1"]  # the engine's rank 0 not traced
    assert summary["shared_devices"] == []
    assert lines == [next(line for line in lines if line.startswith("profile step 2: trainer_rank1 cpu busy"))]


def test_a_failing_step_writes_no_trace_and_raises_its_own_error(tmp_path):
    settings = ProfilerConfig(steps=(1, 2))
    group = InProcessGroup("hybrid", 1, settings)
    profiler = StepProfiler(settings, tmp_path, echo=lambda line: None)
    with pytest.raises(ZeroDivisionError):
        with profiler.around(1, [group]):
            1 / 0
    assert group.calls == ["profile_start", "profile_cancel"] and not (tmp_path / "profile").exists()
    with profiler.around(2, [group]):  # the profiler was released: the next traced step runs
        sum(range(1000))
    assert (tmp_path / "profile" / "step_2" / "summary.json").is_file()
