"""A stop signal to ``rlcore train`` ends the job cleanly in every phase: exit 128 + the signal within
30 s, the last complete checkpoint intact (byte for byte) and resumable, no process of the job and no
temp folder left behind, no checkpoint staging folder left in the run folder.

The signal goes to the driver only, as ``kill`` and ``timeout`` send it, while the job is held inside
the phase: the reward function stalls (step 2's reward workers, the first validation); the stall
plugin (``tests/e2e/stalls.py``, loaded through its entry point as any plugin) stalls a generation or
the actor's update; a checkpoint write is frozen (SIGSTOP) while its staging folder exists and the
signal is delivered as it continues; the asynchronous form's rollout worker stalls generating a batch
ahead. The job is then run again, with the same settings (the stall happens once), and resumes.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time

import pytest

from tests.e2e.conftest import job_overrides, read_metrics, start_train, train
from tests.e2e.stalls import PHASE_OVERRIDES, background_job, folder_digest, freeze_inside_a_save, install_stall_plugin

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

# phase, signal, under Ray, where it stops: the last complete checkpoint then (None: none yet)
CASES = [
    ("reward", signal.SIGTERM, True),  # step 2's reward workers, under Ray: its SIGTERM handler is not the job's
    ("validation", signal.SIGINT, False),  # step 1's validation, before step 1's save
    ("generation", signal.SIGHUP, False),  # step 2's generation (hf engine)
    ("update", signal.SIGTERM, False),  # step 2's actor update, inside the policy loss
    ("checkpoint", signal.SIGTERM, False),  # a checkpoint write after step 1's
    ("async", signal.SIGTERM, True),  # colocated form: step 3's batch generating ahead in the rollout worker
]
# an async job's deadline under Ray (about 25 s on the 2-core CI machine); in the job's own process 60 s
TIMEOUT_S, RAY_TIMEOUT_S = 60, 180


@pytest.fixture
def private_tmpdir(monkeypatch):
    """TMPDIR for the job: empty, short (Ray's socket paths live under it), removed afterwards."""
    folder = tempfile.mkdtemp(prefix="rs-")
    monkeypatch.setenv("TMPDIR", folder)
    yield folder
    monkeypatch.delenv("TMPDIR")
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize(("phase", "signum", "ray"), CASES, ids=[c[0] for c in CASES])
def test_a_stop_signal_ends_the_job_cleanly_and_it_resumes(tiny_model, gsm8k_parquet, tmp_path, private_tmpdir,
                                                           phase, signum, ray):
    run, marker, site = tmp_path / "run", tmp_path / "stalled", None
    steps = 3 if phase in ("checkpoint", "async") else 2  # a save after step 1's to cut; step 3's batch ahead
    overrides = job_overrides(tiny_model, gsm8k_parquet, run, **{
        "trainer.total_training_steps": steps, "trainer.test_freq": 1 if phase == "validation" else -1}) + [
        "algorithm.adv_estimator=grpo", "rollout.n=2", "trainer.val_before_train=false"]
    if phase in ("reward", "validation"):
        reward = tmp_path / "stalling_reward.py"
        reward.write_text(STALLING_REWARD.format(calls=str(tmp_path / "calls"), marker=str(marker), phase=phase,
                                                 samples_per_step=8))
        overrides.append(f"reward.custom_reward_function.path={reward}")
    elif phase in ("generation", "update", "async"):
        site = install_stall_plugin(tmp_path / "site", "update" if phase == "update" else "generation", marker, run)
        overrides += PHASE_OVERRIDES["update" if phase == "update" else "generation"]
    if phase == "async":
        overrides += ['async_training.mode="colocated"', "async_training.max_staleness=1"]

    with background_job(lambda stdout: start_train(*overrides, stdout=stdout, ray=ray, site=site),
                        tmp_path / "job.log") as job:
        if phase == "checkpoint":
            cut = freeze_inside_a_save(job, run, after=1)  # frozen inside step `cut`'s save
            saved = str(cut - 1)
        else:
            job.wait_until(marker.exists, f"the stall in phase {phase}")
            # the async job stalls generating step 3's batch ahead; the driver goes on to step 2's save
            saved = {"reward": "1", "validation": None, "generation": "1", "update": "1", "async": "2"}[phase]
            latest = run / "latest_checkpointed_iteration.txt"
            job.wait_until(lambda: (latest.read_text() if latest.exists() else None) == saved,
                           f"checkpoint {saved} as the latest")
            time.sleep(1.0)  # the stalled call is under way
        intact = folder_digest(run / f"global_step_{saved}") if saved else None
        stop = job.stop(signum, frozen=phase == "checkpoint")
    stop.check(signum)
    assert os.listdir(private_tmpdir) == [], f"left in the temp folder: {os.listdir(private_tmpdir)}"

    latest = run / "latest_checkpointed_iteration.txt"
    assert (latest.read_text() if latest.exists() else None) == saved
    assert not list(run.glob(".global_step_*")), "a staging folder was left"
    kept = [f"global_step_{s}" for s in range(1, int(saved or 0) + 1)]  # and no half-published newer one
    assert sorted(p.name for p in run.glob("global_step_*")) == kept
    if saved:
        assert folder_digest(run / f"global_step_{saved}") == intact, "the last complete checkpoint changed"

    result = train(*overrides, timeout=RAY_TIMEOUT_S if ray else TIMEOUT_S, ray=ray, site=site)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [m["step"] for m in read_metrics(run)] == list(range(1, steps + 1))
    if saved:
        assert f"at step {saved}" in result.stdout
    assert (run / "latest_checkpointed_iteration.txt").read_text() == str(steps)
