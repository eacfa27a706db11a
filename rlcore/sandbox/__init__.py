"""Run model-written Python where it cannot hurt the trainer or the machine.

``run_code(code, limits)`` starts ``boot.py`` (as root) in a process group of its own; it gives the
code a fresh private tmpfs as its working directory, new mount, pid and network namespaces, resource
limits (CPU seconds, address space, processes, file size, open files) and an unprivileged uid, and
runs it with a scrubbed environment. The caller reads at most ``max_output_bytes`` of output and
kills the whole process group at the wall-clock deadline or the output cap; the pid namespace takes
every process the code forked with it. See docs/tools.md for what is and is not isolated.

Isolation needs root (to create the namespaces and to switch to the unprivileged uid under which the
kernel enforces RLIMIT_NPROC); elsewhere ``run_code`` refuses with a ``SandboxError``.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs

from rlcore.errors import RlcoreError

BOOT = Path(__file__).with_name("boot.py")
MiB = 1 << 20


class SandboxError(RlcoreError):
    """The sandbox could not be set up as its limits demand (the code never ran)."""


@attrs.frozen
class SandboxLimits:
    """What code in the sandbox may use. Small by default: a tool call or a unit test, not a job."""

    timeout_s: float = 10.0  # wall clock, then the whole process group is killed
    cpu_seconds: int = 5
    memory_bytes: int = 512 * MiB  # address space (RLIMIT_AS)
    processes: int = 16  # RLIMIT_NPROC for the sandbox's own uid
    file_size_bytes: int = 4 * MiB
    open_files: int = 64
    tmpfs_bytes: int = 64 * MiB  # the private /tmp, /dev/shm and /var/tmp
    max_output_bytes: int = 64 * 1024  # stdout and stderr each; more kills the run
    require_network_isolation: bool = True  # False: run even where no network namespace can be made


@attrs.frozen
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed by the sandbox (timeout, output cap)
    timed_out: bool = False
    output_truncated: bool = False
    duration_s: float = 0.0
    network_isolated: bool = True

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_truncated


# The environment the code sees: nothing of the trainer's (tokens, keys, paths).
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp/work",
             "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}


def sandbox_uid() -> int:
    """A fresh unprivileged uid per run, with no passwd entry and no files on the host: a run's
    RLIMIT_NPROC counts only its own processes, and nothing on disk belongs to it."""
    return 200_000 + secrets.randbelow(1_000_000)


def run_code(code: str, limits: SandboxLimits = SandboxLimits(), stdin: str = "") -> SandboxResult:
    """Run ``code`` as a Python script in the sandbox; its output and how it ended."""
    if os.geteuid() != 0:
        raise SandboxError("the code sandbox needs root: it creates namespaces and runs the code as an "
                           "unprivileged uid, under which the kernel enforces its process limit")
    spec = {"code": code, "stdin": stdin, "uid": sandbox_uid(), "env": CLEAN_ENV,
            "interpreter": os.path.realpath(sys.executable), "prefix": sys.base_prefix,
            "require_network_isolation": limits.require_network_isolation,
            "limits": attrs.asdict(limits)}
    report_r, report_w = os.pipe()
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", str(BOOT), str(report_w)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, pass_fds=(report_w,), start_new_session=True, env=CLEAN_ENV)
    os.close(report_w)
    run = _Run(process, os.fdopen(report_r, "rb", buffering=0))
    try:
        process.stdin.write(json.dumps(spec).encode())
        process.stdin.close()
        stdout, stderr, timed_out, truncated = run.collect(limits, started + limits.timeout_s)
    finally:
        run.end()
    status = run.status
    if "error" in status:
        raise SandboxError(f"the code sandbox could not be set up: {status['error']}" + (
            " (no network namespace on this machine; set require_network_isolation = false to run code "
            "with the network reachable)" if "unshare(net)" in status["error"] else ""))
    killed = timed_out or truncated
    return SandboxResult(stdout.decode(errors="replace"), stderr.decode(errors="replace"),
                         None if killed else process.returncode, timed_out, truncated,
                         time.monotonic() - started, status.get("network_isolated", False))


class _Run:
    """One launched run: its pipes, the launcher's report, and the pidfd of the code's pid 1."""

    def __init__(self, process: subprocess.Popen, report):
        self.process, self.report = process, report
        self.status: dict = {}
        self.report_text = b""
        self.pidfd: int | None = None

    def _on_report(self, chunk: bytes) -> None:
        self.report_text += chunk
        for line in self.report_text.splitlines():
            message = json.loads(line) if line.endswith(b"}") else {}
            if "pid" in message and self.pidfd is None:
                try:  # a pidfd: a signal through it cannot hit a recycled pid
                    self.pidfd = os.pidfd_open(message["pid"])
                except ProcessLookupError:  # already gone
                    pass
            elif message:
                self.status.update(message)

    def _on_report_rest(self) -> None:
        try:
            self._on_report(self.report.read() or b"")
        except (BlockingIOError, ValueError):  # ValueError: a partial line was split across reads
            pass

    def collect(self, limits: SandboxLimits, deadline: float):
        """Read stdout and stderr until both close, the deadline passes or either exceeds the cap."""
        process = self.process
        buffers = {process.stdout: bytearray(), process.stderr: bytearray()}
        timed_out = truncated = False
        with selectors.DefaultSelector() as selector:
            for stream in (*buffers, self.report):
                selector.register(stream, selectors.EVENT_READ)
            while any(key.fileobj in buffers for key in selector.get_map().values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                for key, _ in selector.select(timeout=left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                    elif key.fileobj is self.report:
                        self._on_report(chunk)
                    else:
                        buffer = buffers[key.fileobj]
                        buffer += chunk
                        if len(buffer) > limits.max_output_bytes:
                            del buffer[limits.max_output_bytes:]
                            truncated = True
                if truncated:
                    break
        if not timed_out and not truncated:  # the pipes closed: pid 1 is gone; the launcher exits next
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        return bytes(buffers[process.stdout]), bytes(buffers[process.stderr]), timed_out, truncated

    def end(self) -> None:
        """Kill whatever still runs and wait until it is gone: SIGKILL to pid 1 takes its whole pid
        namespace (whatever process groups or sessions the code made); the launcher reaps pid 1 only
        after the last of them has exited, then exits itself."""
        os.set_blocking(self.report.fileno(), False)  # what has been reported so far; never wait here
        try:
            self._on_report(self.report.read() or b"")
        except BlockingIOError:
            pass
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(self.pidfd)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        try:  # the launcher itself, if it is still there; pid 1 follows it (parent-death signal)
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        self._on_report_rest()
        for stream in (self.process.stdout, self.process.stderr, self.report):
            stream.close()
