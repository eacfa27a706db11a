"""What a trace says (``rlcore.profiling.timeline``): busy and idle time, nested operators counted once,
traces of two processes aligned by their base times, and kernels of processes sharing a device."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from rlcore.profiling.timeline import (intersection, merged, process_summary, read_trace, shared_device,
                                       top_level)

BASE_NS = 1_790_000_000_000_000_000  # a trace's baseTimeNanoseconds; its ts are microseconds after it
BASE_US = BASE_NS / 1_000


def write_trace(path, events, base_ns=BASE_NS):
    payload = {"schemaVersion": 1, "baseTimeNanoseconds": base_ns, "traceEvents": events}
    with gzip.open(path, "wt") as handle:
        json.dump(payload, handle)
    return path


def op(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


def test_busy_idle_and_the_costliest_names_of_one_process(tmp_path):
    events = [
        op("aten::linear", 100, 400), op("aten::mm", 150, 300),  # mm inside linear: counted once
        op("aten::add", 700, 100, tid=2), op("aten::add", 750, 100),  # two threads at once: 150 us of cover
        op("ampere_sgemm", 200, 300, cat="kernel"), op("ampere_sgemm", 600, 100, cat="kernel"),
        op("Memcpy HtoD", 550, 50, cat="gpu_memcpy"),
        {"ph": "i", "cat": "cpu_op", "name": "instant", "ts": 10},  # no duration: not work
        op("aten::empty", 5_000, 10),  # after the window: left out
    ]
    path = write_trace(tmp_path / "t.json.gz", events)
    trace = read_trace(path, (BASE_US + 0, BASE_US + 1_000))
    summary = process_summary(trace)
    assert summary["window_s"] == pytest.approx(0.001)
    cpu, device = summary["cpu"], summary["device"]
    assert cpu["busy_s"] == pytest.approx((400 + 150) / 1e6)  # linear 100-500, adds 700-850
    assert cpu["idle_s"] == pytest.approx((1_000 - 550) / 1e6)
    assert cpu["longest_idle_s"] == pytest.approx(200 / 1e6)  # 500-700 (0-100 and 850-1000 shorter)
    assert [t["name"] for t in cpu["top"]] == ["aten::linear", "aten::add"]  # mm is linear's child
    assert cpu["top"][1] == {"name": "aten::add", "seconds": pytest.approx(200 / 1e6), "count": 2}
    assert device["busy_s"] == pytest.approx((300 + 50 + 100) / 1e6)  # 200-500, 550-700
    assert device["busy_share"] == pytest.approx(0.45)
    assert device["idle_over_10ms"] == 0 and device["events"] == 3


def test_a_trace_without_device_events_says_so():
    from rlcore.profiling.timeline import Trace

    summary = process_summary(Trace((0.0, 2e6), [], [(0.0, 1e6, "aten::mm")]))
    assert summary["device"] is None and summary["cpu"]["busy_share"] == 0.5
    assert summary["cpu"]["idle_over_10ms"] == 1 and summary["cpu"]["longest_idle_s"] == 1.0


def test_operators_nested_in_one_thread_are_counted_once():
    spans = [(0, 10, "outer"), (2, 5, "child"), (3, 4, "grandchild"), (10, 12, "next"), (11, 20, "overlaps next")]
    assert [s[2] for s in top_level(spans)] == ["outer", "next"]


def test_traces_of_two_processes_line_up_by_their_base_times(tmp_path):
    """Each process's ts count from its own base: the same moment has different ts in the two files."""
    first = write_trace(tmp_path / "a.json.gz", [op("k", 1_000, 500, cat="kernel")], base_ns=BASE_NS)
    second = write_trace(tmp_path / "b.json.gz", [op("k", 0, 500, cat="kernel")], base_ns=BASE_NS + 1_250_000)
    window = (BASE_US, BASE_US + 3_000)
    a, b = merged(read_trace(first, window).device), merged(read_trace(second, window).device)
    assert a.tolist() == [[BASE_US + 1_000, BASE_US + 1_500]] and b.tolist() == [[BASE_US + 1_250, BASE_US + 1_750]]
    shared = shared_device({"trainer": a, "engine": b}, window)
    assert shared["processes"] == ["engine", "trainer"]
    assert shared["all_busy_s"] == pytest.approx(250 / 1e6)  # 1250-1500
    assert shared["any_busy_s"] == pytest.approx(750 / 1e6)  # 1000-1750
    assert shared["none_busy_s"] == pytest.approx((3_000 - 750) / 1e6)


def test_the_shared_window_cuts_what_lies_outside_it():
    a = np.array([[0.0, 10.0], [20.0, 30.0]])
    b = np.array([[5.0, 25.0]])
    shared = shared_device({"a": a, "b": b}, (8.0, 22.0))
    assert shared["window_s"] == pytest.approx(14e-6)
    assert shared["any_busy_s"] == pytest.approx(14e-6) and shared["all_busy_s"] == pytest.approx(4e-6)  # 8-10, 20-22


def test_interval_arithmetic():
    assert merged([(5, 6), (0, 2), (1, 3), (3, 4)]).tolist() == [[0, 4], [5, 6]]
    assert merged([]).shape == (0, 2)
    a, b = merged([(0, 4), (6, 10)]), merged([(2, 7), (9, 12)])
    assert intersection(a, b).tolist() == [[2, 4], [6, 7], [9, 10]]
    assert intersection(a, merged([])).shape == (0, 2)


def test_the_async_benchmark_reads_each_traced_step_of_a_run(tmp_path):
    """``benchmarks/async_modes.py --profile``: one row per traced step, busy seconds per process and the
    shared device's, from the summaries the runs wrote."""
    import sys

    from rlcore.profiling.steps import step_summary
    from tests.conftest import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    import async_modes

    window = (0.0, 4e6)
    capture = {"window": window, "notes": [], "device_key": "node a cuda 0", "trace": "x.pt.trace.json.gz"}
    trainer = capture | {"label": "trainer_rank0", "device_busy": np.array([[0.0, 2e6]]), "cpu_busy": np.zeros((0, 2)),
                         "summary": {"window_s": 4.0, "device": {"busy_s": 2.0}, "cpu": {"busy_s": 0.5}}}
    engine = capture | {"label": "rollout_rank0", "device_busy": np.array([[1e6, 3e6]]), "cpu_busy": np.zeros((0, 2)),
                        "summary": {"window_s": 4.0, "device": {"busy_s": 2.0}, "cpu": {"busy_s": 0.2}}}
    folder = tmp_path / "colocated" / "profile" / "step_4"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(step_summary(4, [trainer, engine])))
    (row,) = async_modes.profile_rows(tmp_path / "colocated")
    assert row == {"step": 4, "trainer_rank0 device busy s": 2.0, "trainer_rank0 window s": 4.0,
                   "rollout_rank0 device busy s": 2.0, "rollout_rank0 window s": 4.0, "shared window s": 4.0,
                   "both busy s": 1.0, "either busy s": 3.0, "neither busy s": 1.0}
    assert async_modes.profile_rows(tmp_path / "lockstep") == []  # a run without traces
    assert async_modes.summarize([{"step": s, "timing_s/step": float(s)} for s in (1, 2, 3, 4)], 8, (4,))[
        "s/step"] == 2.5  # the traced step 4 left out of the median of steps 2..


def test_each_rlcore_phase_gets_its_host_time_and_the_kernels_in_its_device_span(tmp_path):
    """A worker method marked ``rlcore.METHOD`` (a user annotation on the host, and on a GPU the span from its
    first kernel to its last): its host time, the operators run meanwhile, and the kernels in its device span;
    annotations of other names are not phases."""
    events = [
        op("rlcore.update_actor", 100, 500, cat="user_annotation"),
        op("aten::mm", 150, 100), op("aten::add", 400, 50),  # inside the update on the host
        op("rlcore.update_actor", 300, 500, cat="gpu_user_annotation"),  # its kernels ran 300-800
        op("sgemm", 300, 200, cat="kernel"), op("sgemm", 600, 100, cat="kernel"),
        op("sgemm", 850, 100, cat="kernel"),  # after the update's span: another phase's
        op("rlcore.compute_ref_log_prob", 700, 100, cat="user_annotation"),  # on the CPU: no device span
        op("ProfilerStep#4", 0, 1_000, cat="user_annotation"),  # torch's own: not a phase
    ]
    trace = read_trace(write_trace(tmp_path / "t.json.gz", events), (BASE_US + 0, BASE_US + 1_000))
    phases = process_summary(trace)["phases"]
    assert set(phases) == {"update_actor", "compute_ref_log_prob"}
    update = phases["update_actor"]
    assert update["host_s"] == pytest.approx(500 / 1e6) and update["cpu_busy_s"] == pytest.approx(150 / 1e6)
    assert update["device_span_s"] == pytest.approx(500 / 1e6)
    assert update["device_busy_s"] == pytest.approx(300 / 1e6)  # 300-500 and 600-700; not 850-950
    assert phases["compute_ref_log_prob"] == {"host_s": pytest.approx(100 / 1e6), "cpu_busy_s": 0.0}
