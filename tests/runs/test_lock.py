"""One job per run folder: the lock names its holder, and a crashed holder's lock is taken over."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from rlcore.errors import RlcoreError
from rlcore.runs.checkpoint import CheckpointManager
from rlcore.runs.lock import LOCK_FILE, RunLock


def test_a_second_job_on_the_folder_is_refused_naming_the_holder(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RlcoreError, match=rf"in use by another job: PID {os.getpid()} on host "
                                              rf"{socket.gethostname()} .*trainer.default_local_dir"):
            RunLock(tmp_path).acquire()
    with RunLock(tmp_path):  # released at the end of the first job
        pass


_HOLDER = textwrap.dedent("""
    import sys, time
    from rlcore.runs.lock import RunLock
    RunLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    time.sleep(60)
""")


def test_a_job_killed_with_its_lock_leaves_the_folder_free(tmp_path, caplog):
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RlcoreError, match=f"PID {holder.pid}"):
            RunLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with RunLock(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert f"PID {holder.pid}" in caplog.text and "ended without releasing" in caplog.text


def test_without_flock_a_dead_holder_on_this_host_is_stale(tmp_path, monkeypatch):
    import fcntl

    def no_flock(fd, op):
        raise OSError(__import__("errno").ENOLCK, "no locks")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=60)
    lock = tmp_path / LOCK_FILE
    lock.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname(), "started": 0}))
    with RunLock(tmp_path):
        pass
    lock.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "started": 0}))
    with pytest.raises(RlcoreError, match=f"PID {os.getppid()}"):
        RunLock(tmp_path).acquire()


def test_saving_never_deletes_another_writers_staging_folder(tmp_path):
    ours, theirs = CheckpointManager(tmp_path, max_to_keep=1), CheckpointManager(tmp_path, max_to_keep=1)
    in_progress = theirs.begin(5)
    (in_progress / "actor").mkdir()
    for step in (1, 2):
        staging = ours.begin(step)
        ours.commit(staging, step, {})
    assert (in_progress / "actor").is_dir()
