"""The core's built-in plugin: registered through the same hooks as any third-party plugin."""

from rlcore import hookimpl


@hookimpl
def rlcore_register_platforms(register):
    from rlcore.platforms import CpuPlatform, CudaPlatform

    register("cpu", CpuPlatform)
    register("cuda", CudaPlatform)


@hookimpl
def rlcore_register_cli_commands(register):
    from rlcore.commands import config, plugins

    register("plugins", plugins.COMMAND)
    register("config", config.COMMAND)
