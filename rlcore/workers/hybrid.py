"""The hybrid worker: one process per device hosting actor, rollout, reference and critic.

Actor and rollout share the process (and, for the ``hf`` engine, the very same weights). The worker
group runs this class as a Ray actor; every method takes and returns plain ``Batch``es or metrics.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch

from rlcore.batch import Batch
from rlcore.config.schema import JobConfig
from rlcore.roles import SamplingParams
from rlcore.workers.plan import RolePlan

WEIGHT_BUCKET_BYTES = 512 * 2**20


class HybridWorker:
    def __init__(self, config: JobConfig, plan: RolePlan, rank: int, world_size: int, master: str,
                 num_threads: int):
        from rlcore.platforms import current_platform
        from rlcore.plugins import get_manager

        if num_threads > 0:
            torch.set_num_threads(num_threads)
        self.rank, self.world_size = rank, world_size
        self.platform = current_platform()
        self.platform.reconcile_visible_devices(os.environ)
        self._init_distributed(master)
        self.platform.manual_seed(config.trainer.seed + rank)
        manager = get_manager()
        backend = manager.get("training_backends", config.trainer.backend)
        self.actor = backend.actor(config, self.platform)
        self.reference = backend.reference(config, self.platform) if plan.reference else None
        self.critic = backend.critic(config, self.platform) if plan.critic else None
        self.rollout = manager.get("rollout_engines", config.rollout.name)(config, self.platform, self.actor)

    def _init_distributed(self, master: str) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            return
        self.platform.set_device(0)  # Ray makes exactly this worker's device visible
        dist.init_process_group(backend=self.platform.dist_init_backend, init_method=f"tcp://{master}",
                                rank=self.rank, world_size=self.world_size)

    # -- the steps the controller runs -----------------------------------------------------------
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        self.rollout.resume_memory()
        try:
            return self.rollout.generate(prompts, sampling)
        finally:
            self.rollout.release_memory()

    def compute_log_prob(self, batch: Batch) -> Batch:
        return self.actor.compute_log_prob(batch)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        return self.reference.compute_ref_log_prob(batch)

    def compute_values(self, batch: Batch) -> Batch:
        return self.critic.compute_values(batch)

    def update_actor(self, batch: Batch) -> dict[str, float]:
        return self.actor.update(batch)

    def update_critic(self, batch: Batch) -> dict[str, float]:
        return self.critic.update(batch)

    def sync_weights(self) -> None:
        self.rollout.update_weights(self.actor.weights_for_rollout(WEIGHT_BUCKET_BYTES))

    def set_total_steps(self, total_steps: int) -> None:
        for role in (self.actor, self.critic):
            if role is not None and hasattr(role, "set_total_steps"):
                role.set_total_steps(total_steps)

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, directory: str) -> None:
        root = Path(directory)
        self.actor.save(str(root / "actor"))
        if self.critic is not None:
            self.critic.save(str(root / "critic"))
        (root / "rng").mkdir(parents=True, exist_ok=True)
        torch.save({"python": random.getstate(), "torch": torch.get_rng_state()},
                   root / "rng" / f"rank_{self.rank}.pt")

    def load(self, directory: str) -> None:
        root = Path(directory)
        self.actor.load(str(root / "actor"))
        if self.critic is not None:
            self.critic.load(str(root / "critic"))
        rng = root / "rng" / f"rank_{self.rank}.pt"
        if rng.is_file():
            state = torch.load(rng, weights_only=False)
            random.setstate(state["python"])
            torch.set_rng_state(state["torch"])

    def ping(self) -> int:
        return os.getpid()
