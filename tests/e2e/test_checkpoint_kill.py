"""A job killed (SIGKILL) while a checkpoint is being written: the save in progress never becomes the
latest, the previous checkpoint resumes, and the resumed job ends with the same weights, bit for bit,
as one that was never interrupted.

The kill is made to land inside the save: the test watches the run folder for the save's staging
folder, freezes the job (SIGSTOP) the moment it appears, checks that the save has not been published
yet, and only then kills it (``tests.e2e.stalls.freeze_inside_a_save``, which ``test_stops.py`` uses to
land a SIGTERM there). Should a save finish between the sighting and the freeze, the job goes on and
the next step's save is taken instead.
"""

from __future__ import annotations

import os
import signal

from tests.e2e.conftest import checkpoint_tensors, job_overrides, read_metrics, start_train, train
from tests.e2e.stalls import background_job, freeze_inside_a_save
from tests.e2e.test_training import assert_same_tensors, deterministic

STEPS = 4


def _kill_inside_a_save(overrides: list[str], run, log_path) -> int:
    """Run the job, SIGKILL it while it writes a checkpoint; the step whose save was cut."""
    with background_job(lambda stdout: start_train(*overrides, stdout=stdout), log_path) as job:
        step = freeze_inside_a_save(job, run, after=1)  # frozen mid-save: nothing moves until the kill
        os.killpg(job.process.pid, signal.SIGKILL)
        job.process.wait(timeout=30)
        return step


def test_a_kill_during_a_checkpoint_write_loses_nothing_and_resumes_to_the_same_weights(
        tiny_model, gsm8k_parquet, tmp_path):
    def job(run):
        return job_overrides(tiny_model, gsm8k_parquet, run, **{"trainer.total_training_steps": STEPS,
                                                                 "trainer.test_freq": -1}) + [
            "algorithm.adv_estimator=grpo", "rollout.n=2", "trainer.val_before_train=false"]

    run = tmp_path / "killed"
    cut = _kill_inside_a_save(job(run), run, tmp_path / "killed.log")
    assert 2 <= cut <= STEPS
    assert (run / "latest_checkpointed_iteration.txt").read_text() == str(cut - 1)
    assert list(run.glob(f".global_step_{cut}.tmp-*")), "the kill did not land inside the save"
    assert not (run / f"global_step_{cut}").exists()

    result = train(*job(run), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"at step {cut - 1}" in result.stdout
    assert not list(run.glob(".global_step_*")), "the cut save's staging folder was not cleaned"
    assert (run / "latest_checkpointed_iteration.txt").read_text() == str(STEPS)

    straight = tmp_path / "straight"
    result = train(*job(straight), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    resumed, uninterrupted = read_metrics(run), read_metrics(straight)
    assert [m["step"] for m in resumed] == [m["step"] for m in uninterrupted] == list(range(1, STEPS + 1))
    for a, b in zip(resumed, uninterrupted, strict=True):
        assert deterministic(a) == deterministic(b), a["step"]
    assert_same_tensors(checkpoint_tensors(run / f"global_step_{STEPS}" / "actor", tmp_path / "scratch" / "a.pt"),
                        checkpoint_tensors(straight / f"global_step_{STEPS}" / "actor", tmp_path / "scratch" / "b.pt"))
