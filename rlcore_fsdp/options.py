"""``[actor.fsdp]``, ``[ref.fsdp]``, ``[critic.fsdp]``: the fsdp backend's own settings (verl:
``actor_rollout_ref.actor.fsdp_config.*``, ``actor_rollout_ref.ref.fsdp_config.*``,
``critic.model.fsdp_config.*``, which this plugin's verl-key aliases carry onto these tables)."""

from __future__ import annotations

import attrs

from rlcore.api import TrainingSpec, setting

SECTIONS = ("actor.fsdp", "ref.fsdp", "critic.fsdp")


@attrs.frozen
class FsdpOptions:
    param_offload: bool = setting(False, doc="keep parameters on the CPU between uses")
    optimizer_offload: bool = setting(False, doc="keep optimizer states on the CPU")
    reshard_after_forward: bool = setting(True, doc="free gathered parameters after forward")
    fsdp_size: int = setting(-1, ge=-1, doc="ranks a model is sharded over; the shard groups replicate each other "
                                            "(hybrid sharding, HSDP); -1: every rank (plain FSDP)")


def options_of(spec: TrainingSpec, section: str) -> FsdpOptions:
    """The options of ``section`` ("actor.fsdp", ...) in a role's spec; the defaults for a job built in
    code rather than loaded (it carries no plugin tables)."""
    return spec.section(section, FsdpOptions())
