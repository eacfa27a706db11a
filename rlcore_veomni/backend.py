"""The ``veomni`` training backend: the factory the worker asks for its actor and reference."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcore.api import RlcoreError, TrainingBackend

if TYPE_CHECKING:
    from rlcore.api import ActorSpec, CriticSpec, Platform, ReferenceSpec
    from rlcore_veomni.roles import VeomniActor, VeomniReference


class VeomniBackend(TrainingBackend):
    """Builds the actor and the reference on VeOmni's model code (``veomni.models.build_foundation_model``:
    the Hugging Face classes as VeOmni patches them, with its kernels) and, over several ranks, its FSDP2
    parallelisation (``veomni.distributed.torch_parallelize.build_parallelize_model``), inside rlcore's
    fsdp roles: the same forwards (padded or packed rows), losses, update loop, weight sync and checkpoints
    (``rlcore export`` turns them into Hugging Face folders). One process per device.

    The families it takes are the dense ones VeOmni carries and rlcore checked (``rlcore_veomni.model.FAMILIES``);
    others are refused by name."""

    name = "veomni"
    requires = ("veomni",)  # checked before a job starts (rlcore.runs.preflight) and by `rlcore plugins`
    builds_critic = False  # a critic-training estimator is refused before the job starts
    applies_model_override_config = True  # model.override_config, on the config VeOmni builds from
    export_command = "rlcore export {checkpoint} --to {checkpoint}-hf"

    def actor(self, spec: ActorSpec, platform: Platform) -> VeomniActor:
        from rlcore_veomni.roles import VeomniActor

        return VeomniActor(spec, platform)

    def reference(self, spec: ReferenceSpec, platform: Platform) -> VeomniReference:
        from rlcore_veomni.roles import VeomniReference

        return VeomniReference(spec, platform)

    def critic(self, spec: CriticSpec, platform: Platform):
        raise RlcoreError("trainer.backend = 'veomni' builds no critic: use an estimator without one "
                          "(algorithm.adv_estimator = 'grpo', ...) or trainer.backend = 'fsdp' for PPO with a critic")
