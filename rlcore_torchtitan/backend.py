"""The ``torchtitan`` training backend: the factory the worker asks for its actor and reference."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcore.api import RlcoreError, TrainingBackend

if TYPE_CHECKING:
    from rlcore.api import ActorSpec, CriticSpec, Platform, ReferenceSpec
    from rlcore_torchtitan.actor import TitanActor, TitanReference


class TorchtitanBackend(TrainingBackend):
    """Builds the actor and the reference on torchtitan's model code (``torchtitan.models.llama3`` or
    ``qwen3``, the weights converted from the Hugging Face folder by torchtitan's own state-dict adapter)
    and parallelism code (its FSDP2 over every rank), one process per device. The
    engine gets the weights back in Hugging Face names; a checkpoint is a Hugging Face folder.

    The families it takes are those torchtitan carries with a Hugging Face adapter that rlcore maps
    (Llama, Qwen3: ``rlcore_torchtitan.model.FAMILIES``); others are refused by name."""

    name = "torchtitan"
    builds_critic = False  # torchtitan's models carry no value head: a critic-training estimator is refused
    requires = ("torchtitan",)  # checked before a job starts (rlcore.runs.preflight) and by `rlcore plugins`
    # a checkpoint carries its Hugging Face folder (rlcore_torchtitan.checkpoint)
    export_command = "none needed: {checkpoint}/actor/hf is a Hugging Face folder"

    def actor(self, spec: ActorSpec, platform: Platform) -> TitanActor:
        from rlcore_torchtitan.actor import TitanActor

        return TitanActor(spec, platform)

    def reference(self, spec: ReferenceSpec, platform: Platform) -> TitanReference:
        from rlcore_torchtitan.actor import TitanReference

        return TitanReference(spec, platform)

    def critic(self, spec: CriticSpec, platform: Platform):
        raise RlcoreError("trainer.backend = 'torchtitan' has no critic (torchtitan's models carry no value head): "
                          "use an estimator without one (algorithm.adv_estimator = 'grpo', ...) or "
                          "trainer.backend = 'fsdp' for PPO with a critic")
