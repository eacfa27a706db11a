"""A stop signal to ``rlcore train`` ends the job cleanly: exit 128 + the signal, the last complete
checkpoint intact and resumable, no process of the job and no temp folder left behind.

The reward function stalls at a chosen place (step 2's reward workers, or the first validation) and
leaves a marker file; the signal goes to the driver only, as ``kill`` and ``timeout`` send it.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time

import psutil
import pytest

from tests.e2e.conftest import job_overrides, read_metrics, start_train, train
from tests.processes import kill_family

STALLING_REWARD = """
import os, time

CALLS, MARKER, PHASE = {calls!r}, {marker!r}, {phase!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    split = (extra_info or {{}}).get("split")
    if split == "train":
        with open(CALLS, "a") as f:
            f.write("x")
    in_phase = (PHASE == "validation" and split == "test") or (
        PHASE == "reward" and split == "train" and os.path.getsize(CALLS) > {samples_per_step})
    if in_phase and not os.path.exists(MARKER):
        open(MARKER, "w").close()
        time.sleep(600)  # wait for the signal
    return 0.0
"""


def _stop_while_stalled(overrides: list[str], marker, signum: int, log_path, ray: bool) -> tuple[int, float, list]:
    """Start the job, wait for the marker, signal the driver; (exit status, seconds to exit, the job's
    processes that are still alive 30 s later)."""
    with open(log_path, "w") as log:
        process = start_train(*overrides, stdout=log, ray=ray)
        try:
            deadline = time.time() + 300
            while not marker.exists():
                assert process.poll() is None, log_path.read_text()
                assert time.time() < deadline, f"the job never reached the stalling reward: {log_path.read_text()}"
                time.sleep(0.2)
            time.sleep(1.0)  # the reward worker is inside its call
            driver = psutil.Process(process.pid)
            family = [driver, *driver.children(recursive=True)]
            sent = time.monotonic()
            process.send_signal(signum)
            status = process.wait(timeout=60)
            seconds = time.monotonic() - sent
        finally:
            kill_family(process)
    _, alive = psutil.wait_procs(family, timeout=30)
    return status, seconds, alive


@pytest.mark.parametrize(("phase", "signum", "ray"), [("reward", signal.SIGTERM, True),
                                                      ("validation", signal.SIGINT, False)])
def test_a_stop_signal_ends_the_job_cleanly_and_it_resumes(tiny_model, gsm8k_parquet, tmp_path, monkeypatch,
                                                           phase, signum, ray):
    run, marker = tmp_path / "run", tmp_path / "stalled"
    reward = tmp_path / "stalling_reward.py"
    reward.write_text(STALLING_REWARD.format(calls=str(tmp_path / "calls"), marker=str(marker), phase=phase,
                                             samples_per_step=8))
    tmpdir = tempfile.mkdtemp(prefix="rs-")  # short: Ray's socket paths live under it
    monkeypatch.setenv("TMPDIR", tmpdir)
    overrides = job_overrides(tiny_model, gsm8k_parquet, run, **{"trainer.total_training_steps": 3,
                                                                  "trainer.test_freq": 1 if phase == "validation" else -1}) + [
        "algorithm.adv_estimator=grpo", "rollout.n=2", "trainer.val_before_train=false",
        f"reward.custom_reward_function.path={reward}"]
    try:
        status, seconds, alive = _stop_while_stalled(overrides, marker, signum, tmp_path / "job.log", ray)
        log = (tmp_path / "job.log").read_text()
        assert status == 128 + signum, log
        assert seconds < 30, f"the job took {seconds:.0f} s to stop: {log}"
        assert f"{signal.Signals(signum).name} received" in log and "*** SIGTERM received" not in log, log
        assert not alive, f"processes left after the stop: {alive}\n{log}"
        assert os.listdir(tmpdir) == [], f"left in the temp folder: {os.listdir(tmpdir)}"
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    # step 1 finished and was saved; step 2 (reward) or step 1's validation (before its save) was cut
    saved = "1" if phase == "reward" else None
    latest = run / "latest_checkpointed_iteration.txt"
    assert (latest.read_text() if latest.exists() else None) == saved
    assert not list(run.glob(".global_step_*")), "a staging folder was left"
    marker.unlink()
    monkeypatch.delenv("TMPDIR")
    calm = [o for o in overrides if not o.startswith("reward.custom_reward_function.path=")]
    result = train(*calm, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3]
    if saved:
        assert "at step 1" in result.stdout
