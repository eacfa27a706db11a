"""A job's ``Trainer`` driven in the test's own process (``trainer.ray = false``): built, started,
stepped, and closed again, for the tests under ``tests/trainer`` (and any test that drives a step)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlcore.config import load_job
from rlcore.trainer import Trainer
from tests.e2e.conftest import job_overrides

GRPO = ["algorithm.adv_estimator=grpo", "rollout.n=2", "actor.use_kl_loss=true", "trainer.val_before_train=false",
        "trainer.save_freq=-1", "trainer.test_freq=-1"]


def in_process_trainer(model: Path, data: Path, run_dir: Path, *extra: str, manager=None) -> Trainer:
    """A GRPO job on ``model`` and ``data`` (``extra`` overrides last), its one worker started here;
    the caller closes it (``started_trainer`` does)."""
    job = load_job(None, [*job_overrides(model, data, run_dir), *GRPO, "trainer.ray=false", *extra],
                   manager=manager)
    trainer = Trainer(job, manager, echo=lambda *_: None)
    trainer.start_workers()
    trainer.workers.call_all("set_total_steps", trainer.total_steps)
    return trainer


@contextmanager
def started_trainer(model: Path, data: Path, run_dir: Path, *extra: str, manager=None) -> Iterator[Trainer]:
    """``in_process_trainer``, whose reward and workers are closed when the block ends, however it ends."""
    trainer = in_process_trainer(model, data, run_dir, *extra, manager=manager)
    try:
        yield trainer
    finally:
        trainer.reward.close()
        trainer.workers.shutdown()


def first_step(model: Path, data: Path, run_dir: Path, *extra: str) -> tuple[dict[str, float], str]:
    """(the metrics, the step plan's description) of the job's first step, run in this process."""
    with started_trainer(model, data, run_dir, *extra) as trainer:
        trainer.global_step = 1
        return trainer.step(), trainer.plan.describe()


def write_length_reward(folder: Path) -> Path:
    """A reward function file scoring a response by its length in characters (mod 7, in [0, 1)):
    scores that differ between samples, so advantages that are not 0."""
    path = folder / "by_length.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return float(len(solution_str) % 7) / 7\n")
    return path
