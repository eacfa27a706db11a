"""A hung child process fails its test within the deadline, named, and leaves no process behind."""

from __future__ import annotations

import sys
import textwrap
import time

import psutil
import pytest

from tests.e2e.conftest import train
from tests.processes import run_process

# Starts a grandchild in the same group and one in a group of its own (as Ray starts its workers),
# writes their pids, then hangs.
HANGING_TREE = textwrap.dedent("""
    import subprocess, sys, time
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    same = subprocess.Popen(sleeper)
    own = subprocess.Popen(sleeper, start_new_session=True)
    open(sys.argv[1], "w").write(f"{same.pid} {own.pid}")
    time.sleep(600)
""")


def _gone(pids: list[int]) -> bool:
    deadline = time.time() + 10
    while time.time() < deadline:
        if not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids):
            return True
        time.sleep(0.1)
    return False


def test_a_hung_process_tree_is_killed_and_the_test_fails_naming_the_job(tmp_path):
    pids = tmp_path / "pids"
    started = time.time()
    with pytest.raises(pytest.fail.Exception, match=r"the hanging tree did not finish in 3 s"):
        run_process([sys.executable, "-c", HANGING_TREE, str(pids)], name="the hanging tree", timeout=3)
    assert time.time() - started < 40
    assert _gone([int(p) for p in pids.read_text().split()]), "a grandchild outlived the timeout"


def test_train_honours_its_timeout(tmp_path):
    """A job that hangs (here: in start-up, through a sitecustomize that sleeps) fails the test at
    ``train(..., timeout=)``, naming its run folder, instead of stalling CI."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import os, time\nopen({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    run = tmp_path / "run"
    with pytest.raises(pytest.fail.Exception, match=rf"rlcore train.*{run.name}.* did not finish in 5 s"):
        train(f"trainer.default_local_dir={run}", timeout=5, site=site)  # a fresh process: the hang is its own
    assert _gone([int((tmp_path / "pid").read_text())])


def test_a_job_on_another_engine_is_seen_in_its_job_file_too(tmp_path):
    """``train`` keeps a job on vLLM or SGLang out of the test's process (their process-wide state): the
    engine is read from the loaded job, so a job file that names one counts as an override does (reading
    the overrides alone took the example file's vllm job for an hf one)."""
    from tests.conftest import REPO
    from tests.e2e.conftest import _engine

    example = str(REPO / "examples" / "gsm8k_grpo_smollm2.toml")
    assert _engine((example,)) == "vllm"
    assert _engine((example, "rollout.name=hf")) == "hf"
    assert _engine(("actor_rollout_ref.rollout.name=sglang",)) == "sglang"  # verl's key
    assert _engine(("no.such.key=1",)) == "hf"  # a job that does not load fails in this process, saying why
