"""The core's rollout engines, registered through the same hook a third-party engine uses."""

from rlcore import hookimpl


@hookimpl
def rlcore_register_rollout_engines(register):
    from rlcore.rollout.declared import RolloutEngine
    from rlcore.rollout.hf import HfRollout

    # generates with the actor's own module; routed experts from forward hooks on the routers
    register("hf", RolloutEngine(HfRollout, borrows_actor_module=True, returns_routed_experts=True,
                                 takes_images=True),
             default=True)  # the engine of a job that names none


@hookimpl
def rlcore_register_job_checks(register):
    from rlcore.rollout.config import problems
    from rlcore.settings import JobCheck

    register("rollout", JobCheck(problems=problems))
