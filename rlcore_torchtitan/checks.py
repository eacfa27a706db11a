"""What a job on the torchtitan backend cannot ask for, found before any worker starts."""

from __future__ import annotations

from rlcore.api import CheckedJob

BACKEND = "torchtitan"


def problems(job: CheckedJob) -> list[str]:
    """An estimator that trains a critic: torchtitan's models carry no value head."""
    # job.config: what a job check reads (tests/core/test_builders_take_specs.py)
    if job.config.trainer.backend != BACKEND:
        return []
    name = job.config.algorithm.adv_estimator
    estimators = job.manager.registry("advantage_estimators")
    if name in estimators and estimators.get(name).needs_critic:
        return [f"algorithm.adv_estimator = {name!r} trains a critic, and trainer.backend = 'torchtitan' has none "
                "(torchtitan's models carry no value head): use an estimator without one ('grpo', 'rloo', ...) "
                "or trainer.backend = 'fsdp'"]
    return []


def unused(job: CheckedJob) -> list[str]:
    """``model.use_remove_padding``: the backend always lays each row's tokens out from its start."""
    if job.config.trainer.backend == BACKEND and job.config.model.use_remove_padding:
        return ["model.use_remove_padding has no effect with trainer.backend = 'torchtitan': it always computes on "
                "each row's real tokens, moved to the row's start (rlcore_torchtitan.forward)"]
    return []
