"""The workers of the asynchronous mode.

``RolloutWorker``: only the engine (for ``hf``, over a model of its own), generating batch after batch.
In the split form the rollout workers have devices of their own; in the colocated form rollout worker
r is a process of its own on the device of trainer worker r (the same Ray bundle, each taking a share
of the device). ``AsyncHybridWorker``: a trainer worker (actor, reference, critic; no engine) that
sends its weights over the weight bridge: all of them, merged, or only its LoRA adapter where the
engine applies adapters itself (``rlcore.rollout.adapters``).

A rollout worker generates through ``execute_generation``, a Ray concurrency group of its own:
generations run one after the other, while its other calls (receiving weights) run beside them. New
weights are staged as they arrive and the engine takes them at the start of its next generation, so a
weight sync never waits for a generation and a generation never sees half of a sync.
"""

from __future__ import annotations

import threading
import time

import attrs
import ray

from rlcore.asynchronous.bridge import WeightBridge
from rlcore.asynchronous.inference_copy import InferenceCopy
from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.metrics.step import Timer
from rlcore.plugins.manager import get_manager
from rlcore.rollout.adapters import actor_adapter, adapter_bucket, takes_adapter, unpacked_adapter
from rlcore.rollout.declared import rollout_engine
from rlcore.rollout.outputs import ROLLOUT_TIMING
from rlcore.runtime.distributed import join_process_group, placement
from rlcore.runtime.platforms import current_platform
from rlcore.training.roles import SamplingParams, group_seed
from rlcore.training.specs import rollout_spec
from rlcore.workers.hybrid import WEIGHT_BUCKET_BYTES, HybridWorker

POLICY_VERSION = "policy_version"  # (B,) int64 batch column: the policy version that generated each sample
# (B,) int64: the version of the weights that ended each sample; newer than POLICY_VERSION where a partial
# rollout took new weights mid-generation (async_training.partial_rollout)
LAST_POLICY_VERSION = "policy_version_last"
GENERATION_GROUP = {"generation": 1}  # the concurrency group generations run in, one at a time


def build_engine(config, platform, sharing_device: int = 1, rank: int = 0):
    """The rollout engine; an engine that generates with an actor's module (``hf``) gets an
    ``InferenceCopy`` of its own. ``sharing_device``: the engines on this device, which divide
    ``rollout.gpu_memory_utilization`` equally, each seeded apart by its pool ``rank`` (each is alone in its
    process group). Returns (engine, copy or None, whether it takes the adapter alone)."""
    engine = rollout_engine(get_manager(), config.rollout.name)
    copy = InferenceCopy(config, platform) if engine.borrows_actor_module else None
    spec = rollout_spec(config)
    if sharing_device > 1:
        share = spec.rollout.gpu_memory_utilization / sharing_device
        spec = attrs.evolve(spec, seed=spec.seed + rank,
                            rollout=attrs.evolve(spec.rollout, gpu_memory_utilization=share))
    rollout = engine(spec, platform, copy)
    return rollout, copy, takes_adapter(engine, rollout)


def engines_per_device(config) -> int:
    """The engine processes on each device: ``async_training.engines_per_device`` in the colocated form, else 1.
    The controller fills an unset value at start (``rlcore.asynchronous.arrangement``); a worker built without
    it (a test of one worker) has one engine on its device."""
    settings = config.section("async_training")
    return (settings.engines_per_device or 1) if settings.mode == "colocated" else 1


def join_bridge(address: str, bridge_rank: int, world_size: int, route: str):
    platform = current_platform()
    return WeightBridge(address, bridge_rank, world_size, platform, platform.device(0), route=route)


class RolloutWorker(HybridWorker):
    """An engine with weights of its own: staged weights, versioned generations."""

    bridge = copy = None
    adapter_only = False  # the engine applies the actor's LoRA adapter itself: only the adapter comes
    version = -1  # the policy version the engine holds (-1: model.path's weights, before the first sync)
    staged: tuple[int, list] | None = None
    sharing_device = 1  # the engines on this worker's device (async_training.engines_per_device)

    def setup(self, master: str) -> None:
        """Join the pool's process group (an engine may shard a model over it), or, where engines share a
        device, a group of this process alone; ``start_engine`` follows."""
        import os

        self.stage_lock = threading.Lock()
        platform = current_platform()
        platform.reconcile_visible_devices(os.environ)
        platform.set_device(0)
        self.device = platform.device(0)
        self.sharing_device = engines_per_device(self.config)
        if self.sharing_device > 1:
            # engines of one device start one after another, and an engine's start may wait in collectives
            # over the worker's group (one did): in the pool's group the first would wait for the next
            join_process_group(platform, master, 0, 1)
        else:
            join_process_group(platform, master, self.rank, self.world_size)
        platform.manual_seed(self.config.trainer.seed + self.rank)

    def start_engine(self) -> None:
        """Start the engine. Engines that share a device start one after the other (the trainer's calls):
        an engine sizes its cache from the device's free memory, which another starting beside it changes."""
        self.rollout, self.copy, self.adapter_only = build_engine(self.config, current_platform(),
                                                                  self.sharing_device, self.rank)
        if self.config.section("async_training").partial_rollout:
            if self.adapter_only:  # the engine's job check says so first, naming its own key
                raise RlcoreError("async_training.partial_rollout = true: the rollout engine applies the actor's "
                                  "LoRA adapter itself, and a generation in flight cannot take a new adapter; set "
                                  "partial_rollout = false, or the engine's own option to take merged weights")
            self.rollout.weights_between_steps = self._weights_mid_generation

    def placement(self) -> tuple[str, dict[str, list[str]]]:
        return placement()

    def takes_adapter(self) -> bool:
        """Whether the engine applies the actor's LoRA adapter itself (the trainer then sends only that)."""
        return self.adapter_only

    def join_bridge(self, address: str, bridge_rank: int, world_size: int, route: str) -> None:
        self.bridge = join_bridge(address, bridge_rank, world_size, route)

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
        started = self.version
        batch = self.rollout.generate(prompts, self.engine_sampling(sampling))
        engine = batch.meta.get(ROLLOUT_TIMING, {})
        phases = {k: timer.seconds.get(k, 0.0) + engine.get(k, 0.0) for k in {*timer.seconds, *engine}}
        versions = {POLICY_VERSION: torch.full((len(batch),), started, dtype=torch.int64),
                    LAST_POLICY_VERSION: torch.full((len(batch),), self.version, dtype=torch.int64)}
        return Batch(batch.tensors | versions, batch.rows, batch.meta | {ROLLOUT_TIMING: phases})

    def engine_sampling(self, sampling: SamplingParams) -> SamplingParams:
        """The call's sampling for this engine: an engine alone in its process group is generation group 0
        there, so the pool's rank is mixed into a seeded call's seed here (distinct engines, distinct samples)."""
        if self.sharing_device == 1 or sampling.seed is None:
            return sampling
        return attrs.evolve(sampling, seed=group_seed(sampling.seed, self.rank))

    def receive_weights(self, version: int) -> tuple[float, bool]:
        """Stage the weights the trainer sends (beside a running generation); returns the seconds the
        transfer took here and whether they are staged in host memory for want of room on the device."""
        start = time.perf_counter()
        # each tensor in a storage of its own, kept until the engine takes them: on the engine's device
        # (split; colocated where the platform lends memory) while it has room, else in host memory
        kept = list(self.bridge.receive())
        with self.stage_lock:
            self.staged = (version, kept)
        return time.perf_counter() - start, self.bridge.landed_on_host

    def _take_staged(self) -> None:
        weights = self._pop_staged()
        if weights is None:
            return
        if self.copy is not None:
            self.copy.load(weights)
        elif self.adapter_only:
            self.rollout.update_adapter(*unpacked_adapter(weights))
        else:
            self.rollout.update_weights(weights)

    def _weights_mid_generation(self):
        """Partial rollouts: the engine asks between two of its steps; the staged weights, if any, load now
        (the rows generating finish under them)."""
        return self._pop_staged()

    def _pop_staged(self):
        """The newest staged weights as buckets on this device (the engine holds their version from now
        on), or None."""
        with self.stage_lock:
            staged, self.staged = self.staged, None
        if staged is None:
            return None
        self.version, buckets = staged
        return ([(name, tensor.to(self.device)) for name, tensor in bucket] for bucket in buckets)

    def save(self, directory: str) -> None:
        """Nothing: the trainer's checkpoint holds the weights; in-flight generations are redone."""

    def load(self, directory: str) -> None:
        """Nothing: the trainer sends its weights after a resume."""


class AsyncHybridWorker(HybridWorker):
    """A trainer worker: the hybrid worker's roles but the engine, and the sending end of a bridge."""

    bridge = None

    def placement(self) -> tuple[str, dict[str, list[str]]]:
        return placement()

    def join_bridge(self, address: str | None, bridge_rank: int, world_size: int, route: str,
                    adapter_only: bool = False) -> None:
        """Join a weight bridge as its sender; ``address`` None: this rank only helps gather the
        weights (the split form's ranks other than 0). ``adapter_only``: the engines apply the actor's
        LoRA adapter themselves, so only the adapter is sent."""
        self.adapter_only = adapter_only
        if address is not None:
            self.bridge = join_bridge(address, bridge_rank, world_size, route)

    def send_weights(self) -> int:
        """Gather the actor's full weights bucket by bucket, or its adapter (every rank), and broadcast
        them (the ranks on a bridge); returns the bytes sent."""
        if self.adapter_only:
            buckets = iter([adapter_bucket(*actor_adapter(self.actor))])
        else:
            buckets = self.actor.weights_for_rollout(WEIGHT_BUCKET_BYTES)
        if self.bridge is None:
            for _ in buckets:  # the gather is collective: every rank walks the buckets
                pass
            return 0
        return self.bridge.send(buckets)
