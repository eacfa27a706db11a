"""A group of hybrid workers: split a batch over data-parallel ranks, run a method, gather in order."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

from rlcore.batch import Batch
from rlcore.config.schema import JobConfig
from rlcore.errors import RlcoreError
from rlcore.workers.plan import RolePlan


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerError(RlcoreError):
    """A worker failed; the message names the role method and rank."""


class WorkerGroup:
    def __init__(self, config: JobConfig, plan: RolePlan, platform):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rlcore.workers.hybrid import HybridWorker

        self.world_size = config.trainer.n_gpus_per_node * config.trainer.nnodes
        resource = platform.ray_resource
        cpus = max(1, (os.cpu_count() or 1) // self.world_size) if resource is None else 1
        bundle = {"CPU": cpus} | ({resource: 1} if resource else {})
        self.placement_group = placement_group([bundle] * self.world_size, strategy="PACK")
        ray.get(self.placement_group.ready(), timeout=120)
        master = f"127.0.0.1:{_free_port()}" if self.world_size == 1 else None
        remote_cls = ray.remote(HybridWorker)
        self.workers = []
        for rank in range(self.world_size):
            options: dict[str, Any] = {
                "num_cpus": cpus,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(self.placement_group, rank),
            } | platform.ray_actor_options(1)
            if master is None:
                master = self._master_address(remote_cls, options)
            self.workers.append(remote_cls.options(**options).remote(
                config, plan, rank, self.world_size, master, cpus))
        self.call_all("ping")  # surface construction errors now, with the rank

    @staticmethod
    def _master_address(remote_cls, options) -> str:
        import ray

        @ray.remote(num_cpus=0)
        def address() -> str:
            with socket.socket() as s:
                s.bind(("", 0))
                return f"{ray.util.get_node_ip_address()}:{s.getsockname()[1]}"

        return ray.get(address.remote())

    # -- dispatch --------------------------------------------------------------------------------
    def _get(self, refs: list, method: str) -> list:
        import ray

        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as exc:
            raise WorkerError(f"a worker died while running {method}: {exc}") from exc
        except ray.exceptions.RayTaskError as exc:
            rank = next((r for r, ref in enumerate(refs) if _failed(ref)), "?")
            raise WorkerError(f"{method} failed on rank {rank}: {exc.cause!r}\n{exc}") from exc

    def call_all(self, method: str, *args) -> list:
        """Run ``method(*args)`` on every worker; one result per rank."""
        return self._get([getattr(w, method).remote(*args) for w in self.workers], method)

    def dispatch(self, method: str, batch: Batch, *args) -> tuple[Batch, float]:
        """Split ``batch`` evenly over the ranks (padding to a multiple), run, and gather in order.

        Returns the gathered batch and the wall seconds of the remote calls.
        """
        padded, pad = _pad_to_multiple(batch, self.world_size)
        shards = padded.chunk(self.world_size)
        start = time.perf_counter()
        results = self._get([getattr(w, method).remote(s, *args) for w, s in zip(self.workers, shards)], method)
        elapsed = time.perf_counter() - start
        merged = Batch.concat(results)
        if pad:
            merged = merged.select(range(len(merged) - pad * _rows_per_input(results, shards)))
        return merged, elapsed

    def dispatch_metrics(self, method: str, batch: Batch) -> dict[str, float]:
        shards = batch.chunk(self.world_size)
        results = self._get([getattr(w, method).remote(s) for w, s in zip(self.workers, shards)], method)
        return reduce_metrics(results)

    def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for worker in self.workers:
            ray.kill(worker)
        remove_placement_group(self.placement_group)


def _failed(ref) -> bool:
    import ray

    try:
        ray.get(ref, timeout=0)
        return False
    except Exception:  # noqa: BLE001 - any failure marks the rank
        return True


def _pad_to_multiple(batch: Batch, parts: int) -> tuple[Batch, int]:
    pad = (-len(batch)) % parts
    if not pad:
        return batch, 0
    return Batch.concat([batch, batch.select(list(range(pad)))]), pad


def _rows_per_input(results: list[Batch], shards: list[Batch]) -> int:
    """Output rows per input row (n for generation, 1 otherwise)."""
    return max(1, len(results[0]) // max(1, len(shards[0])))


def reduce_metrics(results: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for r in results for k in r}
    return {k: sum(r[k] for r in results if k in r) / sum(1 for r in results if k in r) for k in sorted(keys)}


Reducer = Callable[[list[dict[str, float]]], dict[str, float]]
