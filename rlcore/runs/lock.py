"""One job per run folder: an exclusive lock file that names its holder.

Two jobs writing one ``trainer.default_local_dir`` replace each other's checkpoints, delete each
other's staging folders and interleave metrics.jsonl, so a job takes ``<run_dir>/.rlcore.lock``
before anything starts and keeps it to the end.

The lock is an ``flock`` on that file, which the kernel releases when the holder dies however it
dies (SIGKILL, a crashed machine's NFS lease), so a crashed job never leaves a lock behind that
someone has to delete by hand. The file's text (PID, host, start time) is only for the message the
next job prints. Where the filesystem has no ``flock``, the lock falls back to that text: a holder
whose PID is no longer running on this host is stale and taken over.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from rlcore.errors import RlcoreError

LOCK_FILE = ".rlcore.lock"
logger = logging.getLogger(__name__)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's process
        return True
    return True


def _read_holder(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}  # empty (a holder between creating and writing it) or damaged


def _describe(holder: dict) -> str:
    if not holder:
        return "a job that has not written its name yet"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')} (since {started})"


class RunLock:
    """``with RunLock(run_dir):`` holds the run folder for this process, or raises ``RlcoreError``
    naming the job that holds it."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(5):  # the file may be replaced between open and lock: lock what the path names
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if not self._lock(fd):
                    raise RlcoreError(
                        f"the run folder {self.run_dir} is in use by another job: {_describe(_read_holder(self.path))} "
                        f"holds {self.path}. Wait for that job to end, or give this one another "
                        "trainer.default_local_dir.")
                if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                    os.close(fd)
                    continue
            except BaseException:
                if self._fd is None:
                    os.close(fd)
                raise
            self._fd = fd
            self._write_holder()
            return
        raise RlcoreError(f"could not lock {self.path}: it kept being replaced by another process")

    def _lock(self, fd: int) -> bool:
        """True when this process now holds the folder."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            previous = _read_holder(self.path)
            if previous.get("pid") not in (None, os.getpid()):
                logger.warning("taking over %s: %s ended without releasing it", self.path, _describe(previous))
            return True
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
        # No flock on this filesystem: trust the holder's text; a PID gone from this host is stale.
        holder = _read_holder(self.path)
        if not holder:
            return True
        if holder.get("host") == socket.gethostname() and not _pid_running(int(holder.get("pid", 0))):
            logger.warning("taking over %s: %s is no longer running", self.path, _describe(holder))
            return True
        return holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()

    def _write_holder(self) -> None:
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text.encode(), 0)
        os.fsync(self._fd)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # an empty file reads as "free" to a job on a filesystem without flock
        except OSError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
