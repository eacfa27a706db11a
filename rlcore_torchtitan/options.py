"""``[actor.torchtitan]`` and ``[ref.torchtitan]``: the torchtitan backend's own settings, handed to
torchtitan's ``parallelize_llama`` (its ``ParallelismConfig`` and ``TrainingConfig``)."""

from __future__ import annotations

import attrs

from rlcore.api import TrainingSpec, setting

SECTIONS = ("actor.torchtitan", "ref.torchtitan")


@attrs.frozen
class TorchtitanOptions:
    fsdp_reshard_after_forward: str = setting(
        "default", choices=("default", "always", "never"),
        doc="torchtitan's parallelism.fsdp_reshard_after_forward: free gathered parameters after forward "
            "(default: torchtitan's choice, which keeps the last block's)")
    enable_cpu_offload: bool = setting(
        False, doc="torchtitan's training.enable_cpu_offload: parameters, gradients and optimizer states on the CPU "
                   "(FSDP2's CPUOffloadPolicy)")


def options_of(spec: TrainingSpec, section: str) -> TorchtitanOptions:
    """The options of ``section`` ("actor.torchtitan", ...) in a role's spec; the defaults for a job built
    in code rather than loaded (it carries no plugin tables)."""
    return spec.section(section, TorchtitanOptions())
