"""The ``fsdp`` training backend: the factory the worker asks for its actor, reference and critic."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcore.api import TrainingBackend

if TYPE_CHECKING:
    from rlcore.api import ActorSpec, CriticSpec, Platform, ReferenceSpec
    from rlcore_fsdp.actor import FsdpActor, FsdpReference
    from rlcore_fsdp.critic import FsdpCritic


class FsdpBackend(TrainingBackend):
    """Builds roles on FSDP2 (``torch.distributed.fsdp.fully_shard``), one process per device.

    Each call joins the process group the worker set up (or makes a one-rank group) and shards the
    model over all its ranks."""

    name = "fsdp"
    supports_lora = True  # model.lora_rank: adapters on the actor (rlcore_fsdp.lora)
    supports_sequence_parallel = True  # *.ulysses_sequence_parallel_size (rlcore_fsdp.ulysses)
    applies_model_override_config = True  # model.override_config (rlcore.api.load_causal_lm)
    supports_sum_pi_squared = True  # actor.calculate_sum_pi_squared (rlcore_fsdp.forward)
    supports_top_k_distillation = True  # distillation.loss = forward_kl_topk (rlcore_fsdp.forward)
    takes_images = True  # multi_modal_inputs in the actor's and reference's forwards, padded or packed
    replays_routing = True  # actor.router_replay R2 / R3 (rlcore.models.routing hooks in rlcore_fsdp.actor)
    colocated_faster_on_one_device = True  # with vllm, 1.39x lockstep on one H200 (docs/async.md)
    # what the end-of-run summary prints for the last checkpoint (rlcore_fsdp.export)
    export_command = "rlcore export {checkpoint} --to {checkpoint}-hf"

    def actor(self, spec: ActorSpec, platform: Platform) -> FsdpActor:
        from rlcore_fsdp.actor import FsdpActor

        return FsdpActor(spec, platform)

    def reference(self, spec: ReferenceSpec, platform: Platform) -> FsdpReference:
        from rlcore_fsdp.actor import FsdpReference

        return FsdpReference(spec, platform)

    def critic(self, spec: CriticSpec, platform: Platform) -> FsdpCritic:
        from rlcore_fsdp.critic import FsdpCritic

        return FsdpCritic(spec, platform)
