"""``rlcore train [JOB.toml] [key.path=value ...]``: run a training job (verl keys accepted)."""

from __future__ import annotations

import argparse

from rlcore.asynchronous.auto import resolve_auto
from rlcore.asynchronous.config import unused_engines_note
from rlcore.cli import Command
from rlcore.commands.config import report, split_job_and_overrides
from rlcore.errors import RlcoreError
from rlcore.rollout.config import unread_log_probs_off
from rlcore.runtime.stopping import stop_on_signals


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", nargs="?", help="TOML job file (optional when everything is overridden)")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value",
                        help="TOML-literal overrides; verl's keys are accepted and mapped")


def trainer_for(job, manager=None, echo=print):
    """The controller the job asks for: the lockstep ``Trainer``, or ``AsyncTrainer`` when
    ``async_training.mode`` is on. ``auto`` is resolved here, on the driver's platform
    (``rlcore.asynchronous.auto``), and said in one line, as are engines_per_device left unused in lockstep
    and the engine's log-probs left out where nothing reads them; a lockstep job never loads the
    asynchronous controller."""
    from rlcore.trainer import Trainer  # torch: when the command runs, not when ``rlcore`` starts

    choice = None
    if "async_training" in job.config.sections and job.config.section("async_training").mode == "auto":
        from rlcore.runtime.platforms import current_platform

        job, choice = resolve_auto(job, current_platform(), manager)
        if choice is not None:
            echo(choice.line)
    unused = unused_engines_note(job.config)  # lockstep, asked for or chosen, of a job with engines_per_device
    if unused:
        echo(unused)
    job, log_probs = unread_log_probs_off(job)  # after auto, whose stale samples may be corrected with them
    if log_probs is not None:
        echo(log_probs)
    if "async_training" in job.config.sections and job.config.section("async_training").enabled:
        from rlcore.asynchronous.trainer import AsyncTrainer

        return AsyncTrainer(job, manager, echo, mode_choice=choice)
    return Trainer(job, manager, echo, mode_choice=choice)


def _run(args: argparse.Namespace) -> int:
    # the configuration (torch) loads when the command runs, not when ``rlcore`` starts
    from rlcore.config import load_job

    path, overrides = split_job_and_overrides(args.job, args.overrides)
    job = load_job(path, overrides, machine=True)  # files, folders and disk too, before Ray starts
    report(job)
    with stop_on_signals():  # SIGINT, SIGTERM, SIGHUP: the job's clean-up runs, then exit 128 + signal
        trainer = trainer_for(job)  # lockstep, or asynchronous ([async_training])
        trainer.fit()
    # A run that stopped early must not look like a finished one to a pipeline reading the status.
    if not job.config.trainer.val_only and trainer.global_step < trainer.total_steps:
        raise RlcoreError(f"training stopped at step {trainer.global_step} of {trainer.total_steps} "
                          f"(run folder {trainer.run_dir})")
    return 0


COMMAND = Command(help="train a policy with PPO, GRPO, ... from a TOML job", configure=_configure, run=_run)
