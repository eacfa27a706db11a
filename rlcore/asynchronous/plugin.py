"""The core's ``[async_training]`` table and its checks, registered as any plugin would."""

from rlcore import hookimpl
from rlcore.asynchronous.config import AsyncConfig, async_problems
from rlcore.plugins.settings import JobCheck


@hookimpl
def rlcore_register_config_sections(register):
    register("async_training", AsyncConfig)


@hookimpl
def rlcore_register_job_checks(register):
    register("async_training", JobCheck(problems=async_problems))
