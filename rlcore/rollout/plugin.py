"""The core's rollout engines, registered through the same hook a third-party engine uses."""

from rlcore import hookimpl


@hookimpl
def rlcore_register_rollout_engines(register):
    from rlcore.rollout.hf import HfRollout

    register("hf", HfRollout, default=True)  # the engine of a job that names none
