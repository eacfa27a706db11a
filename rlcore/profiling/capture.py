"""A worker's side of ``[profiler]``: torch's profiler over one training step in this process, its
trace written whole (a stop or crash leaves no half-written file) and summarized where it was taken."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

from rlcore.errors import RlcoreError
from rlcore.profiling.config import ProfilerConfig
from rlcore.profiling.timeline import merged, process_summary, read_trace
from rlcore.runtime.atomic import publish
from rlcore.runtime.distributed import placement


def device_key(platform) -> str:
    """Which device this process computes on: processes with the same key share one (on the CPU, the
    machine's cores); a Ray worker's node and the accelerators Ray gave it, else this host's."""
    try:
        import ray

        if ray.is_initialized():
            node, accelerators = placement()
            ids = sorted(i for kind in accelerators.values() for i in kind)
            return f"node {node[:12]} {platform.device_type} {','.join(ids) or 'cores'}"
    except ImportError:
        pass
    visible = os.environ.get(platform.visible_devices_env or "", "")
    return f"host {socket.gethostname()} {platform.device_type} {visible or ('cores' if platform.device_type == 'cpu' else '0')}"


def _all_threads_config():
    """Record the operators of every thread (an engine generating in a thread of its own), where this
    torch can; None: the profiling thread's only."""
    try:
        return torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):
        return None


class StepCapture:
    """torch's profiler over one step: ``start``, the step, then ``stop`` for the trace and its summary."""

    def __init__(self, settings: ProfilerConfig, platform):
        self.settings, self.platform = settings, platform
        self.notes: list[str] = []
        self.activities = [ProfilerActivity.CPU] if "cpu" in settings.activities else []
        if "device" in settings.activities:
            if platform.device_type != "cpu" and ProfilerActivity.CUDA in torch.profiler.supported_activities():
                self.activities.append(ProfilerActivity.CUDA)
            else:
                self.notes.append(f"no device kernels recorded: torch's profiler does not see the "
                                  f"{platform.device_type!r} platform's device here")
        if not self.activities:
            self.activities = [ProfilerActivity.CPU]  # something to bound the window with
        self.profile = self.path = None
        self.label, self.started = "", 0.0  # the process's name in the traces; when recording began (us)

    def start(self, step: int, label: str, directory: str) -> StepCapture:
        if torch.autograd._profiler_enabled():  # a second profiler in one process crashes it when exporting
            raise RlcoreError(f"profiler.steps: torch's profiler is already running in {label}'s process (an "
                              "engine's own, turned on by its environment variables, or one a plugin started); one "
                              "runs at a time: stop the other, or leave profiler.steps empty")
        self.label, self.path = label, Path(directory) / f"step_{step}" / f"{label}.pt.trace.json.gz"
        # Kineto's own lines at each start and stop ("USDT: ... profiler_start"), unless the user set a level;
        # a device trace that comes back empty says where Kineto's errors are (stop)
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        s = self.settings
        self.profile = torch.profiler.profile(activities=self.activities, record_shapes=s.record_shapes,
                                              with_stack=s.with_stack, profile_memory=s.profile_memory,
                                              experimental_config=_all_threads_config())
        self.profile.start()
        self.started = time.time_ns() / 1_000
        return self

    def cancel(self) -> None:
        """Stop without writing anything: the step failed or the job is stopping."""
        self.profile.stop()

    def stop(self) -> dict:
        """Stop, write the trace, and return what it says: the summary, this process's device busy
        intervals (for processes sharing its device) and where the trace is."""
        self.platform.device_module.synchronize()  # the kernels this step queued end inside the window
        window = (self.started, time.time_ns() / 1_000)
        self.profile.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # staged beside it under a hidden name (runtime.atomic's staging_file ends in ".tmp", and torch gzips
        # only a name ending in ".gz")
        staged = self.path.with_name(f".{self.path.name[:-len('.json.gz')]}.{os.getpid()}.partial.json.gz")
        try:
            self.profile.export_chrome_trace(str(staged))
            publish(staged, self.path)
        finally:
            staged.unlink(missing_ok=True)
        trace = read_trace(self.path, window)
        if ProfilerActivity.CUDA in self.activities and not trace.device:
            self.notes.append("no device kernels in the trace although they were recorded; KINETO_LOG_LEVEL=4 shows "
                              "the profiler's errors")
        return {"label": self.label, "device_key": device_key(self.platform), "trace": str(self.path),
                "window": window, "summary": process_summary(trace), "notes": self.notes,
                "device_busy": merged(trace.device), "cpu_busy": merged(trace.cpu)}
