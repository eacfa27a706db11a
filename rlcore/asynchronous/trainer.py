"""The asynchronous controller: the engines generate the batches of the next steps while the actor
trains on this one, each sample lagging the trained policy by at most ``max_staleness`` versions.

A policy version is the number of actor updates so far. Step k trains at version k - 1 on the batch
drawn for step k; that batch may be generated as soon as the engines hold version k - 1 - staleness or
newer, and at most ``staleness`` steps ahead. The engines run in rollout workers: on devices of their
own (split) or each beside a trainer worker on its device (colocated). After each update the new
weights are sent over the weight bridge and staged in the engines, which take them at the start of
their next generation; each generated row records in ``policy_version`` the version that made it.
Where the engines apply a LoRA actor's adapter themselves (``rlcore.rollout.adapters``), only the
adapter is sent.
Staleness 0 is lockstep: the same samples, the same losses as ``Trainer``.

A checkpoint records the data position of the last batch trained; batches drawn ahead and not yet
trained are dropped at a kill and drawn again (with the same sampling seeds) after the resume.
"""

from __future__ import annotations

import os
from collections import deque

import attrs

from rlcore.asynchronous.arrangement import arranged, auto_takes_turns
from rlcore.asynchronous.auto import colocated_reason
from rlcore.asynchronous.bridge import colocated_route
from rlcore.asynchronous.config import first_kernels
from rlcore.asynchronous.workers import (
    GENERATION_GROUP,
    LAST_POLICY_VERSION,
    POLICY_VERSION,
    AsyncHybridWorker,
    RolloutWorker,
)
from rlcore.batch import Batch
from rlcore.errors import RlcoreError, SharingUnavailable
from rlcore.metrics.step import Timer
from rlcore.runtime.platforms import current_platform
from rlcore.trainer import Trainer
from rlcore.training.roles import SamplingParams
from rlcore.workers.group import WorkerGroup

OTHER_SIDE = {"trainer": "engine", "engine": "trainer"}


@attrs.define
class InFlight:
    """A batch drawn ahead for ``step``, generating."""

    step: int
    prompts: Batch
    sampling: SamplingParams
    pending: object  # rlcore.workers.group.PendingDispatch
    loader_before: dict  # the loader's state before this batch was drawn (its epoch: the batch's)


class AsyncTrainer(Trainer):
    def __init__(self, job, manager=None, echo=print, mode_choice=None):
        unarranged = job
        job, arrangement = arranged(job, current_platform())  # colocated: what each device holds, if left unset
        super().__init__(job, manager, echo, mode_choice)
        if arrangement is not None:
            echo(arrangement.line)
        self.settings = self.config.section("async_training")
        self.staleness = self.settings.staleness
        self.split = self.settings.mode == "split"
        self.rollout_workers = None  # the engines: a pool of their own (split) or beside the trainer (colocated)
        self.in_flight: deque[InFlight] = deque()
        self.policy_version = 0  # actor updates so far
        self.synced_version = -1  # the newest version staged in the engines
        self.next_step = 1  # the step whose batch is drawn next
        self.trained_epoch = 0  # the epoch of the batch this step trains (drawn steps before)
        self.sharing = None  # colocated: what lets the trainer's and the engine's kernels run at once (or None)
        self.unarranged, self.arrangement = unarranged, arrangement  # the job as given; rlcore's choice or None
        self.staged_on_host: set[int] = set()  # rollout ranks whose device had no room for the staged weights

    # -- workers ---------------------------------------------------------------------------------
    def hybrid_group(self, roles: tuple[str, ...]):
        """The trainer's workers: the hybrid worker's roles but the engine; colocated, each leaves room
        in its bundle (a CPU and an equal share of the device each) for the rollout workers that join it."""
        trainer = self.config.trainer
        return WorkerGroup("trainer", self.config, self.plan, self.platform, trainer.n_gpus_per_node, trainer.nnodes,
                           tuple(r for r in roles if r != "rollout"), worker_class=AsyncHybridWorker,
                           shared_by=1 if self.split else 1 + self.settings.engines_per_device,
                           env=self._sharing_env("trainer"))

    def start_workers(self) -> None:
        if not self.split:
            self.sharing = self._start_device_sharing()
        super().start_workers()
        self.echo(f"async: {self.settings.mode} form, samples lag the trained policy by at most {self.staleness} "
                  f"version(s)" + ("" if self.staleness == 0 or self.config.algorithm.rollout_is else
                                   "; warning: algorithm.rollout_is is off, stale samples train uncorrected"))
        if self.split:
            self._start_rollout_pool()
        else:
            self._start_colocated_engines()

    def _start_rollout_pool(self) -> None:
        """Split: rollout workers on devices of their own; trainer rank 0 broadcasts to all of them."""
        settings = self.settings
        self.rollout_workers = WorkerGroup("rollout", self.config, self.plan, self.platform,
                                           settings.rollout_n_gpus_per_node, settings.rollout_nnodes, ("rollout",),
                                           worker_class=RolloutWorker, concurrency_groups=GENERATION_GROUP,
                                           size_keys="async_training.rollout_nnodes x "
                                                     "async_training.rollout_n_gpus_per_node")
        self.rollout_workers.call_all("start_engine")
        self.echo(f"workers: {self.rollout_workers.world_size} rollout ({self.config.rollout.name} engine, devices of "
                  f"their own) on {len(set(self.rollout_workers.nodes))} node(s); weights from trainer rank 0 over a "
                  f"{self.platform.dist_backend} group spanning "
                  f"{len(set(self.rollout_workers.nodes) | set(self.workers.nodes))} node(s)")
        world = 1 + self.rollout_workers.world_size
        address = self.workers.gather([self.workers.workers[0].execute.remote("rendezvous_address", world)],
                                      "rendezvous_address")[0]
        self._join_bridges([(address, 0, world, "collectives")]
                           + [(None, 0, world, "collectives")] * (self.workers.world_size - 1),
                           [(address, 1 + rank, world, "collectives")
                            for rank in range(self.rollout_workers.world_size)])

    def _start_colocated_engines(self) -> None:
        """Colocated: ``engines_per_device`` rollout workers in the bundle of each trainer worker (its node,
        its device; rollout ranks ``k * r`` on beside trainer rank r), started once the trainer's workers hold
        their memory, the engines of one device one after the other; each trainer worker lends its weights
        to its own engines in device memory where the platform can (CUDA IPC), else through the host (NCCL
        refuses two ranks on one device)."""
        trainer, per_device = self.config.trainer, self.settings.engines_per_device
        self.rollout_workers = WorkerGroup("rollout", self.config, self.plan, self.platform, trainer.n_gpus_per_node,
                                           trainer.nnodes, ("rollout",), worker_class=RolloutWorker,
                                           concurrency_groups=GENERATION_GROUP, place_with=self.workers,
                                           per_bundle=per_device,
                                           env=self._sharing_env("engine"))
        trainers, engines = self.workers.call_all("placement"), self.rollout_workers.call_all("placement")
        if engines != [place for place in trainers for _ in range(per_device)]:
            raise RlcoreError(f"internal: the colocated rollout workers landed on {engines} (node, devices), not "
                              f"beside the trainer workers on {trainers}")
        for slot in range(per_device):  # one engine of each device at a time
            self.rollout_workers.call_ranks("start_engine", range(slot, self.rollout_workers.world_size, per_device))
        route = colocated_route(self.platform)
        how = {"lent": "in device memory it lends (no copy through the host)",
               "host": "through host memory (gloo)"}[route]
        where = ("each a process on its trainer worker's device" if per_device == 1 else
                 f"{per_device} processes on each trainer worker's device, each generating 1/{per_device} of its "
                 "batch (async_training.engines_per_device)")
        self.echo(f"workers: {self.rollout_workers.world_size} rollout ({self.config.rollout.name} engine, {where}) "
                  f"on {len(set(self.rollout_workers.nodes))} node(s); weights from each trainer worker to its own "
                  f"{how}")
        world = 1 + per_device  # a bridge for each trainer worker and its engines
        addresses = self.workers.call_all("rendezvous_address", world)
        self._join_bridges([(address, 0, world, route) for address in addresses],
                           [(addresses[rank // per_device], 1 + rank % per_device, world, route)
                            for rank in range(self.rollout_workers.world_size)])

    def _sharing_env(self, side: str) -> dict[str, str] | None:
        """The environment of the ``side`` ("trainer" or "engine") processes under the device's sharing: its
        compute share, and a lower priority where ``kernel_priority`` puts the other side's kernels first."""
        if self.sharing is None:
            return None
        first = first_kernels(self.settings)
        return self.sharing.env(getattr(self.settings, f"{side}_compute_share"),
                                yields=first not in ("equal", side))

    def _start_device_sharing(self):
        """Colocated: the platform's way of running the trainer's and the engine's kernels at the same
        moment (``async_training.device_sharing``), or None where they take turns; one line says which.
        ``auto`` starts it where the platform declares it faster (``concurrent_sharing_faster``) and takes
        turns, saying why, where it does not or where it cannot start."""
        share, asked = self.settings.trainer_compute_share, self.settings.device_sharing
        engine_share = self.settings.engine_compute_share
        first = first_kernels(self.settings)

        def turns() -> str:  # of the job's settings as they are (chosen again where the sharing fails)
            unused = first_kernels(self.settings)
            return "time slicing, the trainer and the engine take turns on each device" + (
                f" (async_training.kernel_priority = {unused!r} goes unused)" if unused != "equal" else "")

        if asked == "time_slicing":
            self.echo(f"device sharing: {turns()} (async_training.device_sharing)")
            return None
        if asked == "auto" and (why_not := auto_takes_turns(self.config, self.platform)):
            self.echo(f"device sharing: auto -> {turns()}: {why_not} (async_training.device_sharing)")
            return None
        if os.environ.get("RAY_ADDRESS"):
            raise RlcoreError("async_training.device_sharing = 'concurrent' starts its sharing on this machine only, "
                              "and RAY_ADDRESS joins a Ray cluster; set device_sharing = 'time_slicing'")
        try:
            sharing = self.platform.start_device_sharing((share, engine_share))
        except SharingUnavailable as exc:
            if asked == "auto":
                arrangement_line = self._arrange_for_turns(str(exc))
                self.echo(f"device sharing: auto -> {turns()}: {exc} (async_training.device_sharing)")
                if arrangement_line:
                    self.echo(arrangement_line)
                return None
            raise RlcoreError(f"async_training.device_sharing = 'concurrent': {exc}; or set device_sharing = "
                              "'time_slicing'") from None
        engines = "the engine's all" if engine_share == 1.0 else f"the engine's {engine_share:.0%}"
        self.echo(f"device sharing: {'auto -> ' if asked == 'auto' else ''}concurrent through "
                  f"{sharing.description}: the trainer's kernels may use {share:.0%} of each device's compute "
                  f"units, {engines} (async_training.device_sharing, trainer_compute_share"
                  f"{', engine_compute_share' if engine_share < 1.0 else ''})"
                  + (f"; the {first}'s kernels go first, the {OTHER_SIDE[first]}'s at a lower priority "
                     "(async_training.kernel_priority)" if first != "equal" else ""))
        # a limited share that passed the start check still gave NaN from step 1 (docs/async.md)
        for who, limit, key in (("trainer", share, "trainer_compute_share"),
                                ("engine", engine_share, "engine_compute_share")):
            if limit < 1.0:
                self.nonfinite.suspects.append(
                    f"The {who}'s kernels run under {sharing.description} limited to {limit:.0%} of each device's "
                    "compute units, and some limits compute wrong though the start check passes: set "
                    "async_training.device_sharing = 'time_slicing' to see whether the values come back, or try "
                    f"another async_training.{key}.")
        return sharing

    def _arrange_for_turns(self, why: str) -> str | None:
        """The sharing ``auto`` tried did not start (``why``): where rlcore chose the arrangement for kernels
        side by side (two engines at 135M), choose again for taking turns, before any worker starts, and
        record the job that runs (run.toml, and the reason of ``auto``'s mode in environment.json). Returns
        the new arrangement's line, or None where nothing changed."""
        if self.arrangement is None:
            return None
        job, arrangement = arranged(self.unarranged, self.platform, turns=why)
        if arrangement.settings() == self.arrangement.settings():
            return None
        self.job, self.config, self.arrangement = job, job.config, arrangement
        self.settings = self.config.section("async_training")
        if self.mode_choice is not None and self.mode_choice.mode == "colocated":
            self.mode_choice = attrs.evolve(self.mode_choice, reason=colocated_reason(
                self.config, self.platform, self.settings.engines_per_device))
        self._write_record()
        return arrangement.line

    def stop_workers(self) -> None:
        try:
            super().stop_workers()
        finally:
            if self.sharing is not None:
                self.sharing.stop()
                self.sharing = None

    def _join_bridges(self, senders: list[tuple], receivers: list[tuple]) -> None:
        """Each rank's (address, bridge rank, bridge world size, route) on both sides; the senders are
        told whether the engines take the actor's LoRA adapter alone."""
        adapter_only = all(self.rollout_workers.call_all("takes_adapter"))
        if adapter_only:
            self.echo("weights: the engines apply the actor's LoRA adapter themselves; each sync sends the adapter "
                      "only")
        sending = self.workers.submit_each("join_bridge", [(*sender, adapter_only) for sender in senders])
        receiving = self.rollout_workers.submit_each("join_bridge", receivers)
        self.workers.gather(sending, "join_bridge")
        self.rollout_workers.gather(receiving, "join_bridge")

    def worker_groups(self) -> list:
        return super().worker_groups() + ([self.rollout_workers] if self.rollout_workers is not None else [])

    @property
    def engines(self):
        """The group whose workers generate."""
        return self.rollout_workers

    # -- generation ahead ------------------------------------------------------------------------
    def generate(self, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """This step's batch (generated ahead, scored now) and the ``async/`` metrics of its lag."""
        self._draw_ahead()
        flight = self.in_flight.popleft()
        if flight.step != self.global_step:
            raise RlcoreError(f"internal: step {self.global_step} got the batch drawn for step {flight.step}")
        self.trained_epoch = flight.loader_before["epoch"]
        with timer("gen"):  # the wait for this batch: what generation did not hide behind training
            generated = self.engines.collect(flight.pending)
        return self.finish_rollout(flight.prompts, generated, flight.sampling, timer), self._lag_metrics(generated)

    def _draw_ahead(self) -> None:
        """Start the generation of every batch the bounds allow: at most ``staleness`` steps ahead, and
        only where the engines' weights are recent enough for the step that will train it."""
        while (self.next_step <= self.total_steps and self.next_step <= self.global_step + self.staleness
               and self.next_step - 1 - self.synced_version <= self.staleness):
            before = self.loader.state_dict()
            prompts = self.loader.next_batch()
            sampling = self.sampling_params(step=self.next_step)
            pending = self.engines.submit("generate", prompts, sampling, entry="execute_generation")
            self.in_flight.append(InFlight(self.next_step, prompts, sampling, pending, before))
            self.next_step += 1

    def training_epoch(self) -> int:
        """The epoch of the batch this step trains; the loader may have moved on, drawing ahead."""
        return self.trained_epoch

    def dispatch_generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """Validation and baselines: after the generations ahead, with the newest weights."""
        return self.engines.collect(self.engines.submit("generate", prompts, sampling, entry="execute_generation"))

    def _lag_metrics(self, batch: Batch) -> dict[str, float]:
        lag = (self.policy_version - batch[POLICY_VERSION]).float()  # (B,)
        if lag.max() > self.staleness or lag.min() < 0:
            raise RlcoreError(f"internal: step {self.global_step} trains samples {int(lag.min())}..{int(lag.max())} "
                              f"versions old; the bound is async_training.max_staleness = {self.staleness}")
        metrics = {"async/staleness_mean": float(lag.mean()), "async/staleness_max": float(lag.max()),
                   "async/staleness_min": float(lag.min()), "async/policy_version": self.policy_version,
                   "async/batches_ahead": len(self.in_flight)}
        if self.settings.partial_rollout:  # rows that took newer weights mid-generation
            newer = batch[LAST_POLICY_VERSION] > batch[POLICY_VERSION]
            metrics["async/partial_rollout_share"] = float(newer.float().mean())
        return metrics

    # -- weights ---------------------------------------------------------------------------------
    def sync_weights(self) -> dict[str, float]:
        self.policy_version += 1
        return self._push_weights()

    def _push_weights(self) -> dict[str, float]:
        """Stage the actor's weights (version ``policy_version``) in every engine, beside any running
        generation; ``async/weight_sync_s``: the slowest engine's transfer."""
        senders = self.workers.submit_all("send_weights")
        receivers = self.rollout_workers.submit_all("receive_weights", self.policy_version)
        self._wait_for_both(senders, receivers)
        sent = self.workers.gather(senders, "send_weights")
        seconds, on_host = zip(*self.rollout_workers.gather(receivers, "receive_weights"))
        self.synced_version = self.policy_version
        newly = [rank for rank, host in enumerate(on_host) if host and rank not in self.staged_on_host]
        if newly:
            self.staged_on_host.update(newly)
            self.echo(f"weight sync: rollout worker(s) {', '.join(map(str, newly))} had no device memory left for "
                      "the staged weights; they stage them in host memory from now on (a copy to the device at "
                      "each load)")
        return {"async/weight_sync_s": max(seconds), "async/weight_sync_gb": sum(sent) / 1e9}

    def _wait_for_both(self, senders: list, receivers: list) -> None:
        """Wait for both sides of a sync; the first failure on either side stops the job. A trainer
        rank that fails beside a dead rollout worker failed because of it: the death is named."""
        import ray

        remaining = [*senders, *receivers]
        while remaining:
            (ready,), remaining = ray.wait(remaining, num_returns=1)
            try:
                ray.get(ready)
            except Exception:  # noqa: BLE001 - the groups' own gathers describe it
                if ready not in senders:
                    self.rollout_workers.gather(receivers, "receive_weights")
                self.rollout_workers.check_deaths(receivers, "receive_weights")
                self.workers.gather(senders, "send_weights")

    # -- checkpoints -----------------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        """As ``Trainer``'s, with the data position of the last batch trained (batches drawn ahead are
        drawn again after a resume) and the policy version."""
        state = super().checkpoint_state()
        if self.in_flight:
            state["loader"] = self.in_flight[0].loader_before
        return state | {"policy_version": self.policy_version}

    def resume(self) -> dict | None:
        state = super().resume()
        if state is not None:  # a checkpoint of a lockstep run counts one version per step
            self.policy_version = state["policy_version"] if "policy_version" in state else self.global_step
        self.next_step = self.global_step + 1
        self._push_weights()  # the engines start from the actor's weights, resumed or initial
        return state
