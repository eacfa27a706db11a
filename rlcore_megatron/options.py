"""``[actor.megatron]``, ``[ref.megatron]``, ``[critic.megatron]``: the megatron backend's own settings
(verl: ``actor_rollout_ref.actor.megatron.*``, ``actor_rollout_ref.ref.megatron.*``,
``critic.megatron.*``, which rlcore's verl-key mapping carries onto these tables).

Actor, reference and critic of a worker share one process and so one Megatron parallel layout:
their tensor- and pipeline-parallel sizes must agree: unset in ``ref`` or ``critic`` they are the
actor's, and a different one is an error. The data-parallel size is what is left: workers / (TP x PP).
"""

from __future__ import annotations

import attrs

from rlcore.config.fields import setting

SECTIONS = ("actor.megatron", "ref.megatron", "critic.megatron")


@attrs.frozen
class MegatronOptions:
    tensor_model_parallel_size: int | None = setting(
        None, ge=1, doc="ranks each layer's matrices are split over (unset: 1 for the actor, else the actor's)")
    pipeline_model_parallel_size: int | None = setting(
        None, ge=1, doc="stages the layers are split over (unset: 1 for the actor, else the actor's)")
    use_distributed_optimizer: bool = setting(True, doc="shard fp32 master weights and Adam state over the "
                                                        "data-parallel ranks (ZeRO-1); actor and critic only")


def options_of(config, section: str) -> MegatronOptions:
    """The options of ``section``; the defaults for a job built in code rather than loaded (it
    carries no plugin tables)."""
    return config.sections[section] if section in config.sections else MegatronOptions()


def parallel_sizes(config, section: str) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes of ``section`` ("actor.megatron", ...), unset ones filled in."""
    actor = options_of(config, "actor.megatron")
    own = options_of(config, section)
    tp = own.tensor_model_parallel_size or actor.tensor_model_parallel_size or 1
    pp = own.pipeline_model_parallel_size or actor.pipeline_model_parallel_size or 1
    return tp, pp
