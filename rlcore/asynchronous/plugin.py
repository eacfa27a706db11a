"""The core's ``[async_training]`` table and its checks, registered as any plugin would."""

from rlcore import hookimpl


@hookimpl
def rlcore_register_config_sections(register):
    from rlcore.asynchronous.config import AsyncConfig

    register("async_training", AsyncConfig)


@hookimpl
def rlcore_register_job_checks(register):
    from rlcore.asynchronous.config import async_problems
    from rlcore.settings import JobCheck

    register("async_training", JobCheck(problems=async_problems))
