"""A group of hybrid workers: split a batch over data-parallel ranks, run a method, gather in order.

Resources come from one Ray placement group per node (STRICT_PACK, ``n_gpus_per_node`` bundles),
``nnodes`` of them; rank r lives in bundle ``r % n_gpus_per_node`` of node ``r // n_gpus_per_node``.
On a machine without GPUs a bundle is one CPU, so the same code runs in tests. A group may share its
bundles with a second group (``shared_by``, ``place_with``): rank r of each in the same bundle, on the
same device, each process taking a fraction of it; or ``per_bundle`` ranks of the second beside each rank
of the first.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.workers.hybrid import HybridWorker

# Which role a worker method belongs to, for error messages.
METHOD_ROLES = {
    "generate": "rollout", "compute_log_prob": "actor", "update_actor": "actor", "sync_weights": "actor",
    "compute_ref_log_prob": "reference", "compute_values": "critic", "update_critic": "critic",
    "compute_rm_score": "reward model",
    "save": "checkpoint", "load": "checkpoint", "setup": "setup",
    "join_bridge": "weight sync", "send_weights": "weight sync", "receive_weights": "weight sync",
    "placement": "setup", "start_engine": "setup",
}

# The keys that bound a step's device memory: what a step that runs out of it names, so that the user
# knows what to lower (the example's 32768-token update micro-batches ran out of an 80 GB GPU's memory)
MEMORY_KEYS = {
    "update_actor": "actor.ppo_max_token_len_per_gpu (the tokens of a micro-batch with actor.use_dynamic_bsz) or "
                    "actor.ppo_micro_batch_size_per_gpu",
    "compute_log_prob": "rollout.log_prob_max_token_len_per_gpu or rollout.log_prob_micro_batch_size_per_gpu",
    "compute_ref_log_prob": "ref.log_prob_max_token_len_per_gpu or ref.log_prob_micro_batch_size_per_gpu",
    "compute_values": "critic.forward_max_token_len_per_gpu or critic.ppo_micro_batch_size_per_gpu",
    "update_critic": "critic.ppo_max_token_len_per_gpu or critic.ppo_micro_batch_size_per_gpu",
}
ENGINE_MEMORY_KEY = "rollout.gpu_memory_utilization (the inference engine's share of each device)"
CHECKPOINTING_KEYS = {"update_actor": "model.enable_gradient_checkpointing",
                      "update_critic": "critic.model.enable_gradient_checkpointing"}


def memory_advice(method: str, cause: BaseException, engines_on_device: int = 1) -> str:
    """For a step that ran out of device memory, the keys to lower (and the switch to turn on); else nothing.
    ``engines_on_device``: the engine processes on each device beside the trainer (colocated); more than one
    each hold their own weights and context, so fewer is named too (two beside a 1.5B trainer ran an 80 GB
    card out of memory at a weight sync, 2026-12-07)."""
    if "OutOfMemoryError" not in {kind.__name__ for kind in type(cause).__mro__}:
        return ""
    keys = [MEMORY_KEYS[method]] if method in MEMORY_KEYS else []
    if engines_on_device > 1:
        keys.append(f"async_training.engines_per_device ({engines_on_device} engine processes share each device, "
                    "each with its own copy of the weights)")
    switch = f", or set {CHECKPOINTING_KEYS[method]} = true" if method in CHECKPOINTING_KEYS else ""
    return f" The device ran out of memory: lower {' or '.join([*keys, ENGINE_MEMORY_KEY])}{switch}."


def describe_failure(group: str, method: str, rank: int, what: str, cause: BaseException,
                     logs: str = "Ray's worker logs have the full traceback (rlcore --debug shows the driver's)",
                     engines_on_device: int = 1) -> str:
    """What a worker's failure tells the user: which group, rank, role and step, the error's last line,
    what to lower where the device ran out of memory, and that the last checkpoint is intact."""
    role = METHOD_ROLES.get(method, method)
    detail = str(cause).strip().splitlines()
    reason = detail[-1] if detail else type(cause).__name__
    advice = memory_advice(method, cause, engines_on_device)
    return (f"{group} worker rank {rank} {what} during {role} step {method!r}: {type(cause).__name__}: "
            f"{reason}.{advice} The job stopped; the last checkpoint is intact. {logs}.")


DEATH_GRACE_S = 10.0  # how long a failure waits for the other ranks to show whether one of them died


def _first_death(pending: list, index: dict, grace_s: float) -> tuple[int, str, BaseException] | None:
    """(rank, "died", error) of the first of ``pending`` whose worker died within ``grace_s``."""
    import ray

    if not pending:
        return None
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=grace_s)
    for ref in sorted(ready, key=index.get):
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return index[ref], "died", exc
        except Exception:  # noqa: BLE001 - another symptom; the death is what is looked for
            continue
    return None


class WorkerError(RlcoreError):
    """A worker failed or died; the message names the role, the method and the rank."""


class PendingDispatch:
    """A ``WorkerGroup.submit`` under way: its remote results and how to unpad them."""

    def __init__(self, method: str, refs: list, pad: int, shard_rows: int):
        self.method, self.refs, self.pad, self.shard_rows = method, refs, pad, shard_rows


class WorkerGroup:
    def __init__(self, name: str, config, plan, platform, n_per_node: int, nnodes: int, roles: tuple[str, ...],
                 worker_class=None, concurrency_groups: dict[str, int] | None = None,
                 size_keys: str = "trainer.nnodes x trainer.n_gpus_per_node", shared_by: int = 1,
                 place_with: WorkerGroup | None = None, per_bundle: int = 1, env: dict[str, str] | None = None):
        """``worker_class``: the Ray actor class (default ``HybridWorker``); ``concurrency_groups``: Ray's
        concurrency groups of its methods (the asynchronous mode generates in one, trains in the other);
        ``size_keys``: the settings that size the group, for the error when Ray cannot place it;
        ``shared_by``: how many processes each bundle will hold (one CPU each, an equal share of the
        device); ``place_with``: a group made with ``shared_by`` > 1 whose bundles this group's workers
        join, rank for rank (the same nodes and devices; its placement groups stay its own); ``per_bundle``:
        with ``place_with``, this group's workers in each of its bundles (ranks ``b * per_bundle`` on beside
        its rank b); ``env``: variables its worker processes start with (beside the job's own)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.name, self.roles = name, roles
        self.world_size = n_per_node * nnodes * per_bundle
        self.overhead_s = 0.0  # wall time of remote calls not spent in the workers' own work
        if place_with is not None:
            if ((place_with.world_size, len(place_with.placement_groups)) != (n_per_node * nnodes, nnodes)
                    or place_with.processes_per_bundle < 1 + per_bundle):
                raise RlcoreError(f"internal: the {name} workers ({nnodes} node(s) x {n_per_node} x {per_bundle}) "
                                  f"cannot share the bundles of the {place_with.name} workers "
                                  f"({place_with.world_size} in {len(place_with.placement_groups)} placement "
                                  f"group(s), made for {place_with.processes_per_bundle} process(es) each)")
            self.placement_groups, self.owns_placement_groups = place_with.placement_groups, False
            self.device_share = place_with.device_share
            self.processes_per_bundle = place_with.processes_per_bundle
        elif per_bundle != 1:
            raise RlcoreError(f"internal: the {name} workers: per_bundle = {per_bundle} needs place_with")
        else:
            self.placement_groups, self.owns_placement_groups = self._reserve(
                name, platform, n_per_node, nnodes, shared_by, size_keys), True
            self.device_share = 1.0 / shared_by
            self.processes_per_bundle = shared_by
        remote_cls = (ray.remote(concurrency_groups=concurrency_groups) if concurrency_groups else ray.remote)(
            worker_class or HybridWorker)
        self.workers = []
        for rank in range(self.world_size):
            bundle = rank // per_bundle  # numbered across the nodes
            strategy = PlacementGroupSchedulingStrategy(self.placement_groups[bundle // n_per_node],
                                                        bundle % n_per_node)
            options: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": strategy, "max_restarts": 0}
            options |= platform.ray_actor_options(self.device_share)
            if env:  # merged with the job's env_vars (rlcore.workers.cluster) by Ray
                options["runtime_env"] = {"env_vars": env}
            # the node's processes, this group's and those that will share its bundles, divide its cores
            self.workers.append(remote_cls.options(**options).remote(
                config, plan, roles, rank, self.world_size, n_per_node * self.processes_per_bundle))
        master = self._get([self.workers[0].execute.remote("rendezvous_address", self.world_size)],
                           "rendezvous_address")[0]
        self.call_all("setup", master)
        self.nodes = self.call_all("node_id")

    def _reserve(self, name: str, platform, n_per_node: int, nnodes: int, shared_by: int, size_keys: str) -> list:
        """One STRICT_PACK placement group per node: ``n_per_node`` bundles of one device and a CPU for
        each of the ``shared_by`` processes that will live in it."""
        import ray
        from ray.util.placement_group import placement_group

        bundle = {"CPU": shared_by} | ({platform.ray_resource: 1} if platform.ray_resource else {})
        groups = [placement_group([bundle] * n_per_node, strategy="STRICT_PACK", name=f"rlcore-{name}-node{i}")
                  for i in range(nnodes)]
        try:
            ray.get([pg.ready() for pg in groups], timeout=120)
        except ray.exceptions.GetTimeoutError:
            self.placement_groups = groups
            self._remove_placement_groups()
            raise RlcoreError(
                f"Ray could not reserve {nnodes} node(s) x {n_per_node} x {bundle} for the {name} workers "
                f"within 120 s ({size_keys}); cluster resources: "
                f"{ray.cluster_resources()}") from None
        return groups

    # -- dispatch --------------------------------------------------------------------------------
    def _get(self, refs: list, method: str, ranks: Sequence[int] | None = None) -> list:
        """Results in rank order (``refs`` of ``ranks``, default all); the first failure anywhere raises at
        once (ranks blocked in a collective with a dead peer would otherwise hang the driver)."""
        import ray

        ranks = range(len(refs)) if ranks is None else ranks
        index = {ref: rank for rank, ref in zip(ranks, refs, strict=True)}
        results: dict[int, Any] = {}
        pending, start, worker_seconds = list(refs), time.perf_counter(), 0.0
        while pending:
            (ready,), pending = ray.wait(pending, num_returns=1)
            rank = index[ready]
            try:
                results[rank], seconds = ray.get(ready)
            except ray.exceptions.RayActorError as exc:
                raise WorkerError(self._describe(method, rank, "died", exc)) from None
            except ray.exceptions.RayTaskError as exc:
                # a rank whose peer died fails in the collective it shared with it: name the death,
                # the cause, if one shows up shortly among the other ranks
                death = _first_death(pending, index, DEATH_GRACE_S)
                if death is not None:
                    raise WorkerError(self._describe(method, *death)) from None
                raise WorkerError(self._describe(method, rank, "failed", exc)) from None
            worker_seconds = max(worker_seconds, seconds)
        self.overhead_s += max(0.0, time.perf_counter() - start - worker_seconds)
        return [results[rank] for rank in ranks]

    def _describe(self, method: str, rank: int, what: str, exc: BaseException) -> str:
        # a colocated device holds the trainer and processes_per_bundle - 1 engines
        return describe_failure(self.name, method, rank, what, getattr(exc, "cause", None) or exc,
                                engines_on_device=self.processes_per_bundle - 1)

    def call_all(self, method: str, *args) -> list:
        """Run ``method(*args)`` on every worker; one result per rank."""
        return self._get([w.execute.remote(method, *args) for w in self.workers], method)

    def call_ranks(self, method: str, ranks: Sequence[int], *args) -> list:
        """``call_all`` on ``ranks`` alone; one result for each."""
        return self._get([self.workers[rank].execute.remote(method, *args) for rank in ranks], method, ranks)

    def dispatch(self, method: str, batch: Batch, *args) -> Batch:
        """Split ``batch`` evenly over the ranks (padding to a multiple), run, gather in order, unpad."""
        return self.collect(self.submit(method, batch, *args))

    def submit(self, method: str, batch: Batch, *args, entry: str = "execute") -> PendingDispatch:
        """``dispatch`` started, not waited for: ``collect`` gathers it. ``entry``: the worker's method
        that runs ``method`` (its concurrency group)."""
        pad = (-len(batch)) % self.world_size
        padded = Batch.concat([batch, batch.select(list(range(pad)))]) if pad else batch
        shards = padded.chunk(self.world_size)
        return PendingDispatch(method, [getattr(w, entry).remote(method, s, *args)
                                        for w, s in zip(self.workers, shards)], pad, len(shards[0]))

    def collect(self, pending: PendingDispatch) -> Batch:
        results = self._get(pending.refs, pending.method)
        merged = Batch.concat(results)
        if pending.pad:
            per_row = len(results[0]) // pending.shard_rows  # n outputs per prompt for generation, else 1
            merged = merged.select(range(len(merged) - pending.pad * per_row))
        return merged

    def submit_all(self, method: str, *args) -> list:
        """``call_all`` started, not waited for: ``gather`` waits for its results."""
        return [w.execute.remote(method, *args) for w in self.workers]

    def submit_each(self, method: str, args_per_rank: list[tuple]) -> list:
        """``submit_all`` with arguments of each rank's own: rank r runs ``method(*args_per_rank[r])``."""
        return [w.execute.remote(method, *args) for w, args in zip(self.workers, args_per_rank, strict=True)]

    def gather(self, refs: list, method: str) -> list:
        return self._get(refs, method)

    def dispatch_metrics(self, method: str, batch: Batch, data_parallel_ranks: Sequence[int] | None = None
                         ) -> dict[str, float]:
        """Run an update on consecutive shards, one per rank; metrics averaged over ranks.
        ``data_parallel_ranks``: each rank's data-parallel group (``TrainingBackend.data_parallel_ranks``);
        every group gets an equal part of the batch (default: every rank is a group)."""
        ranks = range(self.world_size) if data_parallel_ranks is None else data_parallel_ranks
        shares = data_parallel_shares(len(batch), ranks, method)
        starts = [sum(shares[:rank]) for rank in range(len(shares))]
        shards = [batch.select(range(start, start + share)) for start, share in zip(starts, shares)]
        return reduce_metrics(self._get([w.execute.remote(method, s) for w, s in zip(self.workers, shards)],
                                        method))

    def check_deaths(self, refs: list, method: str, grace_s: float = DEATH_GRACE_S) -> None:
        """Raise ``WorkerError`` naming the first worker of ``refs`` (one per rank) that died within
        ``grace_s``: the cause to name when a peer in another group fails in a collective with it."""
        death = _first_death(refs, {ref: rank for rank, ref in enumerate(refs)}, grace_s)
        if death is not None:
            raise WorkerError(self._describe(method, *death))

    def take_overhead(self) -> float:
        seconds, self.overhead_s = self.overhead_s, 0.0
        return seconds

    def shutdown(self) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        if self.owns_placement_groups:
            self._remove_placement_groups()

    def _remove_placement_groups(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.placement_groups:
            remove_placement_group(pg)


def data_parallel_shares(rows: int, data_parallel_ranks: Sequence[int], method: str) -> list[int]:
    """The rows of each rank when ``rows`` are handed out in consecutive slices in rank order: every
    data-parallel group (``data_parallel_ranks[rank]``) gets the same number, spread over its ranks as
    evenly as can be (its first ranks one row more)."""
    members = Counter(data_parallel_ranks)
    if rows % len(members):
        raise RlcoreError(f"{method}: {rows} rows do not split evenly over {len(members)} data-parallel groups")
    per_group, taken, shares = rows // len(members), Counter(), []
    for group in data_parallel_ranks:
        base, extra = divmod(per_group, members[group])
        shares.append(base + (taken[group] < extra))
        taken[group] += 1
    return shares


def reduce_metrics(results: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for r in results for k in r}
    return {k: sum(r[k] for r in results if k in r) / sum(1 for r in results if k in r) for k in sorted(keys)}
