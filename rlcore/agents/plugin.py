"""The core's ``[rollout.agent]`` table and its checks, registered as any plugin would."""

from rlcore import hookimpl


@hookimpl
def rlcore_register_config_sections(register):
    from rlcore.agents.config import SECTION, AgentConfig

    register(SECTION, AgentConfig)


@hookimpl
def rlcore_register_job_checks(register):
    from rlcore.agents.config import problems
    from rlcore.settings import JobCheck

    register("agents", JobCheck(problems=problems))
