"""What a job on the torchtitan backend asks for that it ignores, said before any worker starts (what it cannot
do is refused from the backend's declared capabilities: rlcore.training.backends)."""

from __future__ import annotations

from rlcore.api import CheckedJob

BACKEND = "torchtitan"


def unused(job: CheckedJob) -> list[str]:
    """``model.use_remove_padding``: the backend always lays each row's tokens out from its start."""
    if job.config.trainer.backend == BACKEND and job.config.model.use_remove_padding:
        return ["model.use_remove_padding has no effect with trainer.backend = 'torchtitan': it always computes on "
                "each row's real tokens, moved to the row's start (rlcore_torchtitan.forward)"]
    return []
