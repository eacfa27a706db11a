"""The ``megatron`` training backend: the factory the worker asks for its actor, reference and critic.

megatron-core needs Python >= 3.12 and CUDA: the CPU suite checks the config mapping and the weight
conversion (against megatron-core's ``GPTModel`` built on the CPU where it is installed); the GPU
tests (``tests/megatron/test_on_device.py``, ``tests/e2e/test_megatron_jobs.py``) check the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcore.api import TrainingBackend

if TYPE_CHECKING:
    from rlcore.api import ActorSpec, CriticSpec, Platform, ReferenceSpec, TrainingSpec
    from rlcore_megatron.actor import MegatronActor, MegatronReference
    from rlcore_megatron.critic import MegatronCritic


class MegatronBackend(TrainingBackend):
    """Builds roles on megatron-core (``GPTModel`` with the local layer spec, tensor and pipeline
    parallel from ``[actor.megatron]``, Megatron's DDP and distributed optimizer), one process per
    device. A missing megatron-core is one error with the install command."""

    name = "megatron"
    requires = ("megatron.core",)  # checked before a job starts (rlcore.runs.preflight) and by `rlcore plugins`
    replays_routing = True  # actor.router_replay R2 / R3 (rlcore_megatron.routing)

    def actor(self, spec: ActorSpec, platform: Platform) -> MegatronActor:
        from rlcore_megatron.actor import MegatronActor

        return MegatronActor(spec, platform)

    def reference(self, spec: ReferenceSpec, platform: Platform) -> MegatronReference:
        from rlcore_megatron.actor import MegatronReference

        return MegatronReference(spec, platform)

    def critic(self, spec: CriticSpec, platform: Platform) -> MegatronCritic:
        from rlcore_megatron.critic import MegatronCritic

        return MegatronCritic(spec, platform)

    def data_parallel_ranks(self, spec: TrainingSpec, workers: int) -> list[int]:
        """Megatron's rank order puts tensor-parallel ranks next to each other, then context parallel,
        then data parallel, then pipeline stages: rank r is in data-parallel group
        (r // (tp x cp)) % (workers // (tp x cp x pp)). A group's tensor, context and pipeline ranks put
        their shares together (``share_within_model_parallel``)."""
        from rlcore_megatron.options import context_parallel_size, parallel_sizes

        section = f"{spec.role}.megatron"
        tp, pp = parallel_sizes(spec, section)
        cp = context_parallel_size(spec, section)
        if workers % (tp * cp * pp):
            return list(range(workers))  # refused where the model is built, naming the keys
        data_parallel = workers // (tp * cp * pp)
        return [(rank // (tp * cp)) % data_parallel for rank in range(workers)]

    def describe_layout(self, spec: TrainingSpec, workers: int) -> str:
        from rlcore_megatron.options import context_parallel_size, expert_parallel_sizes, parallel_sizes

        tp, pp = parallel_sizes(spec, "actor.megatron")
        cp = context_parallel_size(spec, "actor.megatron")
        ep, _ = expert_parallel_sizes(spec, "actor.megatron")
        layout = f"tensor parallel {tp} x pipeline parallel {pp}" + (f" x context parallel {cp}" if cp > 1 else "") \
            + f" x data parallel {max(workers // (tp * pp * cp), 1)}"
        return layout + (f" (experts over {ep} of the data-parallel ranks)" if ep > 1 else "")
