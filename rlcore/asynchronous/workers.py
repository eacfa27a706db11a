"""The workers of the asynchronous mode.

``RolloutWorker``: a worker of the split form's rollout pool: only the engine (for ``hf``, over a model
of its own), generating batch after batch. ``AsyncHybridWorker``: a trainer worker; in the split form
its rank 0 sends the weights over the weight bridge; in the colocated form it also runs an engine over
weights of its own, one batch ahead of its actor.

Both generate through ``execute_generation``, a Ray concurrency group of its own: generations run one
after the other, while the worker's other calls (training; receiving weights) run beside them. New
weights are staged as they arrive and the engine takes them at the start of its next generation, so a
weight sync never waits for a generation and a generation never sees half of a sync.
"""

from __future__ import annotations

import threading
import time

import ray

from rlcore.batch import Batch
from rlcore.metrics import Timer
from rlcore.roles import SamplingParams
from rlcore.rollout.outputs import ROLLOUT_TIMING
from rlcore.workers.hybrid import WEIGHT_BUCKET_BYTES, HybridWorker

POLICY_VERSION = "policy_version"  # (B,) int64 batch column: the policy version that generated each sample
GENERATION_GROUP = {"generation": 1}  # the concurrency group generations run in, one at a time


def build_engine(config, platform, actor):
    """The rollout engine; an engine that generates with an actor's module (``hf``) gets an
    ``InferenceCopy`` of its own instead of ``actor``. Returns (engine, copy or None)."""
    from rlcore.asynchronous.inference_copy import InferenceCopy
    from rlcore.plugins import get_manager

    factory = get_manager().get("rollout_engines", config.rollout.name)
    copy = InferenceCopy(config, platform) if getattr(factory, "borrows_actor_module", False) else None
    return factory(config, platform, copy or actor), copy


class _OwnEngine:
    """An engine with weights of its own: staged weights, versioned generations."""

    rollout = copy = None
    version = -1  # the policy version the engine holds (-1: model.path's weights, before the first sync)
    staged: tuple[int, list] | None = None

    def _init_engine_state(self) -> None:
        self.stage_lock = threading.Lock()
        self.staged = None

    @ray.method(concurrency_group="generation")
    def execute_generation(self, method: str, *args) -> tuple[object, float]:
        return self.execute(method, *args)

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """The engine's responses under the newest weights staged, each row marked with their version;
        the engine stays awake (its memory is its own: nothing waits to take it back)."""
        import torch

        timer = Timer()
        with timer("load_weights"):
            self._take_staged()
        with timer("prepare"):
            self.rollout.resume_memory()
        batch = self.rollout.generate(prompts, sampling)
        engine = batch.meta.get(ROLLOUT_TIMING, {})
        phases = {k: timer.seconds.get(k, 0.0) + engine.get(k, 0.0) for k in {*timer.seconds, *engine}}
        marked = torch.full((len(batch),), self.version, dtype=torch.int64)
        return Batch(batch.tensors | {POLICY_VERSION: marked}, batch.rows, batch.meta | {ROLLOUT_TIMING: phases})

    def _stage(self, version: int, buckets) -> None:
        """Keep the buckets (copied out of the sender's buffers) for the next generation."""
        kept = [[(name, tensor.clone()) for name, tensor in bucket] for bucket in buckets]
        with self.stage_lock:
            self.staged = (version, kept)

    def _take_staged(self) -> None:
        with self.stage_lock:
            staged, self.staged = self.staged, None
        if staged is None:
            return
        version, buckets = staged
        if self.copy is not None:
            self.copy.load(iter(buckets))
        else:
            self.rollout.update_weights(iter(buckets))
        self.version = version


class RolloutWorker(_OwnEngine, HybridWorker):
    bridge = None

    def setup(self, master: str) -> None:
        """Join the pool's process group (an engine may shard a model over it), then start the engine."""
        import os

        import torch.distributed as dist

        from rlcore.platforms import current_platform

        self._init_engine_state()
        platform = current_platform()
        platform.reconcile_visible_devices(os.environ)
        platform.set_device(0)
        if not dist.is_initialized():
            dist.init_process_group(backend=platform.dist_init_backend, init_method=f"tcp://{master}",
                                    rank=self.rank, world_size=self.world_size)
        platform.manual_seed(self.config.trainer.seed + self.rank)
        self.rollout, self.copy = build_engine(self.config, platform, None)

    def join_bridge(self, address: str, world_size: int) -> None:
        from rlcore.asynchronous.bridge import WeightBridge
        from rlcore.platforms import current_platform

        platform = current_platform()
        self.bridge = WeightBridge(address, 1 + self.rank, world_size, platform, platform.device(0))

    def receive_weights(self, version: int) -> float:
        """Stage the weights the trainer's rank 0 sends (beside a running generation); returns the
        seconds the transfer took here."""
        start = time.perf_counter()
        self._stage(version, self.bridge.receive())
        return time.perf_counter() - start

    def save(self, directory: str) -> None:
        """Nothing: the trainer's checkpoint holds the weights; in-flight generations are redone."""

    def load(self, directory: str) -> None:
        """Nothing: the trainer sends its weights after a resume."""


class AsyncHybridWorker(_OwnEngine, HybridWorker):
    bridge = None

    def setup(self, master: str) -> None:
        """The hybrid worker's roles; colocated (``rollout`` among them), the engine over weights of its own."""
        self._init_engine_state()
        colocated = "rollout" in self.roles
        self.roles = tuple(r for r in self.roles if r != "rollout")
        super().setup(master)
        if colocated:
            from rlcore.platforms import current_platform

            self.roles = self.roles + ("rollout",)
            self.rollout, self.copy = build_engine(self.config, current_platform(), self.actor)

    def join_bridge(self, address: str, world_size: int) -> None:
        """Rank 0 joins the bridge as its sender; the other ranks only help gather the weights."""
        if self.rank != 0:
            return
        from rlcore.asynchronous.bridge import WeightBridge
        from rlcore.platforms import current_platform

        platform = current_platform()
        self.bridge = WeightBridge(address, 0, world_size, platform, platform.device(0))

    def send_weights(self) -> int:
        """Gather the actor's full weights bucket by bucket (every rank) and broadcast them (rank 0);
        returns the bytes sent."""
        buckets = self.actor.weights_for_rollout(WEIGHT_BUCKET_BYTES)
        if self.bridge is None:
            for _ in buckets:  # the gather is collective: every rank walks the buckets
                pass
            return 0
        return self.bridge.send(buckets)

    def stage_local_weights(self, version: int) -> float:
        """Colocated: stage the actor's weights for this worker's own engine; returns the seconds."""
        start = time.perf_counter()
        self._stage(version, self.actor.weights_for_rollout(WEIGHT_BUCKET_BYTES))
        return time.perf_counter() - start
