"""The core's rollout engines, registered through the same hook a third-party engine uses."""

from rlcore import hookimpl
from rlcore.plugins.settings import JobCheck
from rlcore.rollout import config
from rlcore.rollout.declared import RolloutEngine
from rlcore.tools import config as multi_turn


@hookimpl
def rlcore_register_rollout_engines(register):
    from rlcore.rollout.hf import HfRollout  # torch and transformers: when the registry is asked

    # generates with the actor's own module, in the worker's process; routed experts from forward hooks on
    # the routers
    register("hf", RolloutEngine(HfRollout, borrows_actor_module=True, returns_routed_experts=True,
                                 takes_images=True, computes_in_worker_process=True),
             default=True)  # the engine of a job that names none


@hookimpl
def rlcore_register_job_checks(register):
    register("rollout", JobCheck(problems=config.problems))


@hookimpl
def rlcore_register_verl_keys(register):
    register("rollout", config.VERL_KEYS)
    register("rollout.multi_turn", multi_turn.VERL_KEYS)
