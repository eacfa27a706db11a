"""The core's built-in plugin: registered through the same hooks as any third-party plugin.

A hook that registers what needs torch (platforms, loggers, job checks) imports it when called, not when
the plugin loads."""

from rlcore import hookimpl
from rlcore.commands import config, init, plot, plugins, train
from rlcore.plugins.settings import JobCheck


@hookimpl
def rlcore_register_platforms(register):
    from rlcore.runtime.platforms import CpuPlatform, CudaPlatform

    register("cpu", CpuPlatform)
    register("cuda", CudaPlatform)


@hookimpl
def rlcore_register_cli_commands(register):
    register("init", init.COMMAND)
    register("plot", plot.COMMAND)
    register("plugins", plugins.COMMAND)
    register("config", config.COMMAND)
    register("train", train.COMMAND)


@hookimpl
def rlcore_register_loggers(register):
    from rlcore.runs.loggers import ConsoleLogger
    from rlcore.runs.trackers import MlflowLogger, TensorboardLogger, WandbLogger

    register("console", ConsoleLogger)
    register("mlflow", MlflowLogger)
    register("wandb", WandbLogger)
    register("tensorboard", TensorboardLogger)


@hookimpl
def rlcore_register_job_checks(register):
    from rlcore.metrics import validation
    from rlcore.models import routing
    from rlcore.runs import checkpoint, preflight
    from rlcore.training import backends, lr_schedule
    from rlcore.workers import local

    register("training_backend", JobCheck(problems=backends.backend_problems))
    register("router_replay", JobCheck(problems=routing.router_replay_problems))
    register("lr_schedule", JobCheck(problems=lr_schedule.schedule_problems, unused=lr_schedule.schedule_unused))
    register("validation", JobCheck(problems=validation.validation_problems, unused=validation.validation_unused))
    register("checkpoint", JobCheck(problems=checkpoint.checkpoint_problems, unused=checkpoint.checkpoint_unused))
    register("in_process", JobCheck(problems=local.in_process_problems))
    register("machine", JobCheck(problems=lambda job: preflight.machine_problems(job.config, job.manager),
                                 machine=True))
