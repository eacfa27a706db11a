"""The core's built-in plugin: registered through the same hooks as any third-party plugin."""

from rlcore import hookimpl


@hookimpl
def rlcore_register_platforms(register):
    from rlcore.platforms import CpuPlatform, CudaPlatform

    register("cpu", CpuPlatform)
    register("cuda", CudaPlatform)


@hookimpl
def rlcore_register_cli_commands(register):
    from rlcore.commands import config, init, plot, plugins, train

    register("init", init.COMMAND)
    register("plot", plot.COMMAND)
    register("plugins", plugins.COMMAND)
    register("config", config.COMMAND)
    register("train", train.COMMAND)


@hookimpl
def rlcore_register_loggers(register):
    from rlcore.loggers import ConsoleLogger
    from rlcore.trackers import MlflowLogger, TensorboardLogger, WandbLogger

    register("console", ConsoleLogger)
    register("mlflow", MlflowLogger)
    register("wandb", WandbLogger)
    register("tensorboard", TensorboardLogger)


@hookimpl
def rlcore_register_job_checks(register):
    from rlcore import backends, checkpoint, lr_schedule, preflight, routing, validation
    from rlcore.settings import JobCheck
    from rlcore.workers import local

    register("training_backend", JobCheck(problems=backends.backend_problems))
    register("router_replay", JobCheck(problems=routing.router_replay_problems))
    register("lr_schedule", JobCheck(problems=lr_schedule.schedule_problems, unused=lr_schedule.schedule_unused))
    register("validation", JobCheck(problems=validation.validation_problems, unused=validation.validation_unused))
    register("checkpoint", JobCheck(problems=checkpoint.checkpoint_problems, unused=checkpoint.checkpoint_unused))
    register("in_process", JobCheck(problems=local.in_process_problems))
    register("machine", JobCheck(problems=lambda job: preflight.machine_problems(job.config, job.manager),
                                 machine=True))
