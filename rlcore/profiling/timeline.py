"""Where a process's time went in a trace of torch's profiler: the spans its device was busy (kernels,
copies, fills) and its threads ran operators, the idle time between them, the costliest kernels and
operators, the seconds each of rlcore's phases (a worker method: ``rlcore.update_actor``, ...) kept the
host and the device busy, and, for processes that share one device, how long their kernels ran at the
same moment.

Times are microseconds since the epoch: a trace's ``ts`` plus its ``baseTimeNanoseconds``, so traces
of different processes on one machine line up.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import attrs
import numpy as np

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
CPU_CATEGORY = "cpu_op"
HOST_PHASE_CATEGORY, DEVICE_PHASE_CATEGORY = "user_annotation", "gpu_user_annotation"
PHASE_PREFIX = "rlcore."  # the phases a worker names (rlcore.workers.hybrid.HybridWorker.execute)
LONG_IDLE_US = 10_000.0  # an idle stretch counted in ``idle_over_10ms``
TOP = 25  # the costliest kernels and operators listed per process
NAME_CHARS = 120


@attrs.frozen
class Trace:
    """One process's events inside its window, as (start, end, name) in microseconds since the epoch."""

    window: tuple[float, float]
    device: list[tuple[float, float, str]]
    cpu: list[tuple[float, float, str]]  # top-level operators of every thread
    host_phases: list[tuple[float, float, str]] = attrs.field(factory=list)  # rlcore's phases, on the host
    device_phases: list[tuple[float, float, str]] = attrs.field(factory=list)  # ... and the device work they queued


def read_trace(path: str | Path, window: tuple[float, float]) -> Trace:
    """The events of the Chrome trace at ``path`` (``.json`` or ``.json.gz``) that fall in ``window``."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        data = json.load(handle)
    base = data.get("baseTimeNanoseconds", 0) / 1_000
    device, by_thread, phases = [], defaultdict(list), {HOST_PHASE_CATEGORY: [], DEVICE_PHASE_CATEGORY: []}
    for event in data.get("traceEvents", []):
        if event.get("ph") != "X" or "dur" not in event:
            continue
        start = float(event["ts"]) + base
        span = (start, start + float(event["dur"]), str(event.get("name", "?")))
        category = event.get("cat")
        if category in DEVICE_CATEGORIES:
            device.append(span)
        elif category == CPU_CATEGORY:
            by_thread[(event.get("pid"), event.get("tid"))].append(span)
        elif category in phases and span[2].startswith(PHASE_PREFIX):
            phases[category].append(span)
    cpu = [span for spans in by_thread.values() for span in top_level(spans)]
    return Trace(window, clip(device, window), clip(cpu, window), clip(phases[HOST_PHASE_CATEGORY], window),
                 clip(phases[DEVICE_PHASE_CATEGORY], window))


def top_level(spans: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The spans of one thread not nested in another (an operator's children would count twice)."""
    outer, covered_to = [], -np.inf
    for span in sorted(spans, key=lambda s: (s[0], -s[1])):
        if span[0] >= covered_to:
            outer.append(span)
        covered_to = max(covered_to, span[1])
    return outer


def clip(spans: list[tuple[float, float, str]], window: tuple[float, float]) -> list[tuple[float, float, str]]:
    low, high = window
    return [(max(s, low), min(e, high), name) for s, e, name in spans if e > low and s < high]


def merged(spans) -> np.ndarray:
    """The union of ``spans`` ((start, end, ...) each) as sorted, disjoint (start, end) rows."""
    if not len(spans):
        return np.zeros((0, 2))
    pairs = np.array([(s[0], s[1]) for s in spans], dtype=np.float64)
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
    ends = np.maximum.accumulate(pairs[:, 1])
    starts_new = np.ones(len(pairs), dtype=bool)
    starts_new[1:] = pairs[1:, 0] > ends[:-1]
    first = np.flatnonzero(starts_new)
    last = np.append(first[1:] - 1, len(pairs) - 1)
    return np.stack([pairs[first, 0], ends[last]], axis=1)


def covered(intervals: np.ndarray) -> float:
    """Microseconds covered by disjoint (start, end) rows."""
    return float((intervals[:, 1] - intervals[:, 0]).sum()) if len(intervals) else 0.0


def idle_stretches(intervals: np.ndarray, window: tuple[float, float]) -> np.ndarray:
    """The lengths of the stretches of ``window`` that disjoint ``intervals`` leave uncovered."""
    edges = np.concatenate([[window[0]], intervals.reshape(-1), [window[1]]]).reshape(-1, 2)
    return np.clip(edges[:, 1] - edges[:, 0], 0.0, None)


def intersection(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The disjoint (start, end) rows covered by both ``a`` and ``b`` (each sorted and disjoint)."""
    rows, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i, 0], b[j, 0]), min(a[i, 1], b[j, 1])
        if end > start:
            rows.append((start, end))
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return np.array(rows, dtype=np.float64).reshape(-1, 2)


def costliest(spans: list[tuple[float, float, str]]) -> list[dict]:
    """The ``TOP`` names with the most time, each with its seconds and count."""
    seconds, counts = defaultdict(float), defaultdict(int)
    for start, end, name in spans:
        seconds[name] += (end - start) / 1e6
        counts[name] += 1
    ranked = sorted(seconds, key=seconds.get, reverse=True)[:TOP]
    return [{"name": name[:NAME_CHARS], "seconds": round(seconds[name], 6), "count": counts[name]} for name in ranked]


def activity(spans: list[tuple[float, float, str]], window: tuple[float, float]) -> dict:
    """Busy and idle time of one kind of event (device or CPU) over ``window``, in seconds."""
    busy = merged(spans)
    idle = idle_stretches(busy, window)
    length = window[1] - window[0]
    return {"busy_s": round(covered(busy) / 1e6, 6), "busy_share": round(covered(busy) / length, 4) if length else 0.0,
            "idle_s": round(float(idle.sum()) / 1e6, 6), "longest_idle_s": round(float(idle.max(initial=0.0)) / 1e6, 6),
            "idle_over_10ms": int((idle > LONG_IDLE_US).sum()), "events": len(spans), "top": costliest(spans)}


def process_summary(trace: Trace) -> dict:
    """What one process did in its window; ``device`` is None where the trace holds no device event."""
    return {"window_s": round((trace.window[1] - trace.window[0]) / 1e6, 6),
            "device": activity(trace.device, trace.window) if trace.device else None,
            "cpu": activity(trace.cpu, trace.window), "phases": phase_times(trace)}


def phase_times(trace: Trace) -> dict[str, dict]:
    """Each rlcore phase in the window (``rlcore.update_actor``, ...): ``host_s``, how long the host spent
    in it (its annotation's spans), ``cpu_busy_s``, the operators the host ran meanwhile, and where the
    device's work for it is marked (CUDA), ``device_span_s``, from its first kernel to its last, and
    ``device_busy_s``, how long kernels ran in that span (this process's only)."""
    kernels, operators = merged(trace.device), merged(trace.cpu)
    times = {}
    for name in sorted({span[2] for span in trace.host_phases} | {span[2] for span in trace.device_phases}):
        host = merged([span for span in trace.host_phases if span[2] == name])
        entry = {"host_s": round(covered(host) / 1e6, 6),
                 "cpu_busy_s": round(covered(intersection(operators, host)) / 1e6, 6)}
        on_device = merged([span for span in trace.device_phases if span[2] == name])
        if len(on_device):
            entry |= {"device_span_s": round(covered(on_device) / 1e6, 6),
                      "device_busy_s": round(covered(intersection(kernels, on_device)) / 1e6, 6)}
        times[name.removeprefix(PHASE_PREFIX)] = entry
    return times


def shared_device(busy: dict[str, np.ndarray], window: tuple[float, float]) -> dict:
    """Processes on one device, each with its busy intervals: how long any of them, all of them at once,
    and none of them ran a kernel in ``window`` (the stretch all their windows cover)."""
    spans = {label: intersection(rows, np.array([window])) for label, rows in busy.items()}
    together = None
    for rows in spans.values():
        together = rows if together is None else intersection(together, rows)
    any_busy = merged([tuple(row) for rows in spans.values() for row in rows])
    length = window[1] - window[0]
    return {"processes": sorted(busy), "window_s": round(length / 1e6, 6),
            "any_busy_s": round(covered(any_busy) / 1e6, 6), "all_busy_s": round(covered(together) / 1e6, 6),
            "none_busy_s": round((length - covered(any_busy)) / 1e6, 6)}
