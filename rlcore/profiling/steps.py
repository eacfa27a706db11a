"""The controller's side of ``[profiler]``: around each step it names, every worker group starts torch's
profiler in the ranks chosen and stops it when the step ends; the workers' summaries, and for
processes sharing a device how long their kernels ran at the same moment, go to
``step_N/summary.json`` beside the traces and into one console line."""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from pathlib import Path

from rlcore.profiling.config import ProfilerConfig
from rlcore.profiling.timeline import shared_device
from rlcore.runtime.atomic import publish, staging_file


class StepProfiler:
    def __init__(self, settings: ProfilerConfig | None, run_dir: Path, echo=print):
        self.settings, self.echo = settings, echo
        self.directory = Path(settings.dir) if settings and settings.dir else Path(run_dir) / "profile"

    def traces(self, step: int) -> bool:
        return self.settings is not None and step in self.settings.steps

    @contextlib.contextmanager
    def around(self, step: int, groups: list):
        """Trace ``step`` in ``groups``' workers when ``profiler.steps`` names it."""
        if not self.traces(step):
            yield
            return
        try:
            at_once(groups, "profile_start", lambda group: (step, group.name, str(self.directory)))
            yield
        except BaseException:
            for group in groups:  # nothing written: a stop ends fast, and the step's own error is the one told
                with contextlib.suppress(Exception):
                    group.call_all("profile_cancel")
            raise
        captures = [capture for results in at_once(groups, "profile_stop") for capture in results if capture]
        summary = step_summary(step, captures)
        final = self.directory / f"step_{step}" / "summary.json"
        staged = staging_file(final)
        staged.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        publish(staged, final)
        self.echo(summary_line(summary, final.parent))


def at_once(groups: list, method: str, arguments=lambda group: ()) -> list[list]:
    """Each group's results of ``method(*arguments(group))`` on every one of its workers, sent to all the
    groups before any answer is awaited: the profilers of all processes start and stop together, not one
    group after the other."""
    pending = [(group, group.submit_all(method, *arguments(group))) for group in groups]
    return [group.gather(refs, method) for group, refs in pending]


def step_summary(step: int, captures: list[dict]) -> dict:
    """``summary.json``: each traced process, and each device more than one of them shared."""
    processes = [{"process": c["label"], "device": c["device_key"], "trace": Path(c["trace"]).name, **c["summary"],
                  **({"notes": c["notes"]} if c["notes"] else {})} for c in captures]
    on_device = defaultdict(list)
    for capture in captures:
        on_device[capture["device_key"]].append(capture)
    shared = []
    for key, group in on_device.items():
        if len(group) < 2:
            continue
        window = (max(c["window"][0] for c in group), min(c["window"][1] for c in group))
        kind = "device_busy" if all(c["summary"]["device"] for c in group) else "cpu_busy"
        shared.append({"device": key, "activity": "device kernels" if kind == "device_busy" else "cpu operators",
                       **shared_device({c["label"]: c[kind] for c in group}, window)})
    return {"step": step, "processes": processes, "shared_devices": shared}


def summary_line(summary: dict, folder: Path) -> str:
    """One console line: each process's busy share, and what processes sharing a device did at once."""
    parts = []
    for process in summary["processes"]:
        kind = "device" if process["device"] else "cpu"
        busy = process[kind]
        parts.append(f"{process['process']} {kind} busy {busy['busy_s']:.2f} of {process['window_s']:.2f} s "
                     f"(longest idle {busy['longest_idle_s']:.2f} s)")
    for device in summary["shared_devices"]:
        parts.append(f"{' + '.join(device['processes'])} on one device: both busy {device['all_busy_s']:.2f} s, "
                     f"either {device['any_busy_s']:.2f} s, neither {device['none_busy_s']:.2f} s")
    return f"profile step {summary['step']}: " + "; ".join(parts) + f" ({folder})"
