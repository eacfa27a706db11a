"""The core's ``[async_training]`` table, registered as any plugin would."""

from rlcore import hookimpl


@hookimpl
def rlcore_register_config_sections(register):
    from rlcore.asynchronous.config import AsyncConfig

    register("async_training", AsyncConfig)
