"""A worker's capture (``rlcore.profiling.capture``): a real trace of torch's profiler, written whole,
its summary computed from it; the operators of a second thread recorded too (an engine generating in a
thread of its own)."""

from __future__ import annotations

import threading

import torch

from rlcore.profiling.capture import StepCapture
from rlcore.profiling.config import ProfilerConfig
from rlcore.runtime.platforms import CpuPlatform


def matrix_work(steps: int = 30) -> None:
    a = torch.randn(128, 128)
    for _ in range(steps):
        a = torch.tanh(a @ a)


def test_a_capture_writes_its_trace_whole_and_sums_up_both_threads(tmp_path):
    capture = StepCapture(ProfilerConfig(steps=(3,)), CpuPlatform()).start(3, "trainer_rank0", str(tmp_path))
    other = threading.Thread(target=matrix_work)
    other.start()
    matrix_work()
    other.join()
    result = capture.stop()
    assert sorted(p.name for p in (tmp_path / "step_3").iterdir()) == ["trainer_rank0.pt.trace.json.gz"]  # no leftovers
    assert result["label"] == "trainer_rank0" and result["trace"] == str(tmp_path / "step_3" / "trainer_rank0.pt.trace.json.gz")
    summary = result["summary"]
    assert summary["device"] is None and result["notes"] == [
        "no device kernels recorded: torch's profiler does not see the 'cpu' platform's device here"]
    assert 0 < summary["cpu"]["busy_s"] <= summary["window_s"]
    top = {t["name"]: t["count"] for t in summary["cpu"]["top"]}
    assert top.get("aten::matmul", top.get("aten::mm")) == 60  # 30 in each thread
    assert top["aten::tanh"] == 60
    assert result["cpu_busy"].shape[1] == 2 and result["device_busy"].shape == (0, 2)
    assert "cores" in result["device_key"]


def test_a_cancelled_capture_writes_nothing_and_the_next_one_starts(tmp_path):
    settings, platform = ProfilerConfig(steps=(1, 2)), CpuPlatform()
    first = StepCapture(settings, platform).start(1, "hybrid_rank0", str(tmp_path))
    matrix_work(3)
    first.cancel()
    assert not (tmp_path / "step_1").exists()
    second = StepCapture(settings, platform).start(2, "hybrid_rank0", str(tmp_path))  # the profiler was released
    matrix_work(3)
    assert second.stop()["summary"]["cpu"]["busy_s"] > 0


def test_a_second_profiler_in_one_process_is_refused_by_name(tmp_path):
    """torch starts it without a word, then crashes the process when the trace is written."""
    import pytest

    from rlcore.errors import RlcoreError

    other = torch.profiler.profile()
    other.start()
    try:
        with pytest.raises(RlcoreError, match="torch's profiler is already running in trainer_rank0's process"):
            StepCapture(ProfilerConfig(steps=(1,)), CpuPlatform()).start(1, "trainer_rank0", str(tmp_path))
    finally:
        other.stop()
    assert not (tmp_path / "step_1").exists()
