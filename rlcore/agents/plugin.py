"""The core's ``[rollout.agent]`` table and its checks, registered as any plugin would."""

from rlcore import hookimpl
from rlcore.agents.config import SECTION, AgentConfig, problems
from rlcore.plugins.settings import JobCheck


@hookimpl
def rlcore_register_config_sections(register):
    register(SECTION, AgentConfig)


@hookimpl
def rlcore_register_job_checks(register):
    register("agents", JobCheck(problems=problems))
