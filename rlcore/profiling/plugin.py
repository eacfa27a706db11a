"""The core's ``[profiler]`` table and its checks, registered as any plugin would."""

from rlcore import hookimpl
from rlcore.plugins.settings import JobCheck
from rlcore.profiling.config import ProfilerConfig, profiler_problems, profiler_unused


@hookimpl
def rlcore_register_config_sections(register):
    register("profiler", ProfilerConfig)


@hookimpl
def rlcore_register_job_checks(register):
    register("profiler", JobCheck(problems=profiler_problems, unused=profiler_unused))
