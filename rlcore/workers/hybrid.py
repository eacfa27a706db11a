"""The hybrid worker: one process per device hosting actor, rollout, reference, critic and reward model.

Actor and rollout share the process (and, for the ``hf`` engine, the very same weights). A worker
group runs this class as a Ray actor: first ``setup`` (process group, then the roles), then the
steps, each called through ``execute`` so the group can tell the worker's own time from transfer.
"""

from __future__ import annotations

import os
import random
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.profiler import record_function

from rlcore.batch import Batch
from rlcore.config.schema import JobConfig
from rlcore.metrics.step import Timer, memory_metrics
from rlcore.plugins.manager import get_manager
from rlcore.rewards.model import RewardModel
from rlcore.rollout.adapters import actor_adapter, takes_adapter
from rlcore.rollout.declared import rollout_engine
from rlcore.rollout.outputs import ROLLOUT_TIMING
from rlcore.runtime.distributed import join_process_group
from rlcore.runtime.platforms import current_platform
from rlcore.runtime.rendezvous import host_store
from rlcore.training.backends import training_backend
from rlcore.training.roles import SamplingParams
from rlcore.workers.plan import RolePlan
from rlcore.workers.teachers import build_teachers

WEIGHT_BUCKET_BYTES = 512 * 2**20


def host_threads(cores: int, processes_per_node: int) -> int:
    """The torch threads of one of the ``processes_per_node`` worker processes on a node of ``cores`` cores.
    Ray gives each worker OMP_NUM_THREADS=1; they share the node's cores instead, each an equal part. The
    colocated form's engine process counts too: with as many threads as cores in both the trainer and the
    engine, each parallel region waits for threads the other process keeps off the cores (host operations
    a step took milliseconds each beside the engine: docs/async.md)."""
    return max(1, cores // processes_per_node)


def wake_engine(rollout, platform, engine_sleeps: bool) -> None:
    """The engine's memory back before it generates. An engine that slept while the trainer's passes ran
    (``rollout.free_cache_engine``) takes its memory from the device's free memory again, which torch
    still keeps cached from those passes (their activations, freed but held); so the cache goes back to
    the device first, as verl does before waking its rollout; without it a device must hold the trainer's
    cache and the engine at once (docs/rollout-engines.md, "Memory between training and generation")."""
    if engine_sleeps:
        platform.empty_cache()
    rollout.resume_memory()


class HybridWorker:
    def __init__(self, config: JobConfig, plan: RolePlan, roles: tuple[str, ...], rank: int,
                 world_size: int, processes_per_node: int):
        self.config, self.plan, self.roles = config, plan, roles
        self.rank, self.world_size = rank, world_size
        self.actor = self.reference = self.critic = self.rollout = self.reward_model = None
        self.adapter_only = False  # syncs hand the engine the actor's LoRA adapter alone (rlcore.rollout.adapters)
        torch.set_num_threads(host_threads(os.cpu_count() or 1, processes_per_node))

    def execute(self, method: str, *args) -> tuple[object, float]:
        """Run ``method``; returns its result and the seconds it took here. A traced step's summary
        gives each method's host and device time (``rlcore.METHOD``, ``rlcore.profiling.timeline``)."""
        start = time.perf_counter()
        # the profiler's own start and stop stay unmarked: a phase must open and close inside a trace
        with nullcontext() if method.startswith("profile_") else record_function(f"rlcore.{method}"):
            result = getattr(self, method)(*args)
        return result, time.perf_counter() - start

    # -- setup -----------------------------------------------------------------------------------
    def rendezvous_address(self, world_size: int) -> str:
        """``host:port`` of a rendezvous store this worker hosts, already listening, for a group of
        ``world_size`` ranks in which it will be rank 0 (asked of rank 0)."""
        import ray

        return host_store(ray.util.get_node_ip_address(), world_size)

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def setup(self, master: str) -> None:
        """Join the group's process group, then build this worker's roles."""
        platform = current_platform()
        platform.reconcile_visible_devices(os.environ)
        platform.set_device(0)  # Ray makes exactly this worker's device visible
        join_process_group(platform, master, self.rank, self.world_size)
        platform.manual_seed(self.config.trainer.seed + self.rank)
        manager = get_manager()
        backend, specs = training_backend(manager, self.config.trainer.backend), self.plan.specs
        if "actor" in self.roles:
            self.actor = backend.actor(specs.actor, platform)
        if "reference" in self.roles:
            # the LoRA actor's base model is its initial policy, not a distillation teacher
            shareable = self.actor is not None and not self.config.distillation.enable
            shared = self.actor.reference_view() if shareable else None
            if shared is None and self.config.distillation.enable and self.config.distillation.teachers:
                shared = build_teachers(self.config, platform, backend)
            self.reference = shared or backend.reference(specs.reference, platform)
        if "critic" in self.roles:
            self.critic = backend.critic(specs.critic, platform)
        if "rollout" in self.roles:
            engine = rollout_engine(manager, self.config.rollout.name)
            self.rollout = engine(specs.rollout, platform, self.actor)
            self.adapter_only = takes_adapter(engine, self.rollout)
        if "reward_model" in self.roles:
            model = self.config.model
            self.reward_model = RewardModel(self.config.reward.model, platform,
                                            policy_tokenizer=model.tokenizer_path or model.path, dtype=model.dtype)

    # -- the steps the controller runs -----------------------------------------------------------
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """The rollout's responses; the seconds spent waking the engine (``prepare``) and putting it
        back to sleep (``release``) join the engine's own phases in the batch's ``ROLLOUT_TIMING``."""
        timer = Timer()
        with timer("prepare"):
            wake_engine(self.rollout, current_platform(), self.config.rollout.free_cache_engine)
        try:
            batch = self.rollout.generate(prompts, sampling)
        finally:
            with timer("release"):
                self.rollout.release_memory()
        engine = batch.meta.get(ROLLOUT_TIMING, {})
        phases = {k: timer.seconds.get(k, 0.0) + engine.get(k, 0.0) for k in {*timer.seconds, *engine}}
        return Batch(batch.tensors, batch.rows, batch.meta | {ROLLOUT_TIMING: phases})

    def compute_log_prob(self, batch: Batch) -> Batch:
        return self.actor.compute_log_prob(batch)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        return self.reference.compute_ref_log_prob(batch)

    def compute_values(self, batch: Batch) -> Batch:
        return self.critic.compute_values(batch)

    def compute_rm_score(self, batch: Batch) -> Batch:
        return self.reward_model.score(batch)

    def update_actor(self, batch: Batch) -> dict[str, float]:
        return self.actor.update(batch)

    def update_critic(self, batch: Batch) -> dict[str, float]:
        return self.critic.update(batch)

    def sync_weights(self) -> None:
        """The actor's weights to the engine beside it: only its LoRA adapter where the engine applies it."""
        if self.adapter_only:
            self.rollout.update_adapter(*actor_adapter(self.actor))
        else:
            self.rollout.update_weights(self.actor.weights_for_rollout(WEIGHT_BUCKET_BYTES))

    def memory(self) -> dict[str, float]:
        """perf/* memory metrics of this worker (``rlcore.metrics.step.memory_metrics``)."""
        return memory_metrics(current_platform())

    # -- [profiler] ------------------------------------------------------------------------------
    capture = None  # the step being traced (rlcore.profiling.capture)

    def profile_start(self, step: int, group: str, directory: str) -> bool:
        """Start torch's profiler for ``step`` where ``profiler.ranks`` names this rank; whether it did."""
        from rlcore.profiling.capture import StepCapture

        settings = self.config.section("profiler")
        if not settings.traces_rank(self.rank):
            return False
        self.capture = StepCapture(settings, current_platform()).start(step, f"{group}_rank{self.rank}", directory)
        return True

    def profile_stop(self) -> dict | None:
        """Stop the profiler: the trace's summary (``StepCapture.stop``), or None where none ran."""
        capture, self.capture = self.capture, None
        return capture.stop() if capture is not None else None

    def profile_cancel(self) -> None:
        """Stop the profiler, writing nothing (the traced step failed or the job is stopping)."""
        capture, self.capture = self.capture, None
        if capture is not None:
            capture.cancel()

    def set_total_steps(self, total_steps: int) -> None:
        for role in (self.actor, self.critic):
            if role is not None:
                role.set_total_steps(total_steps)

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, directory: str) -> None:
        root = Path(directory)
        if self.actor is not None:
            self.actor.save(str(root / "actor"))
        if self.critic is not None:
            self.critic.save(str(root / "critic"))
        (root / "rng").mkdir(parents=True, exist_ok=True)
        torch.save({"python": random.getstate(), "torch": torch.get_rng_state()},
                   root / "rng" / f"{'_'.join(self.roles)}_rank_{self.rank}.pt")

    def load(self, directory: str) -> None:
        root = Path(directory)
        if self.actor is not None:
            self.actor.load(str(root / "actor"))
        if self.critic is not None:
            self.critic.load(str(root / "critic"))
        rng = root / "rng" / f"{'_'.join(self.roles)}_rank_{self.rank}.pt"
        if rng.is_file():
            state = torch.load(rng, weights_only=False)
            random.setstate(state["python"])
            torch.set_rng_state(state["torch"])
