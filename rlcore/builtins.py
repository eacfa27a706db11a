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
