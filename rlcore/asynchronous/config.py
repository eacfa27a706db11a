"""``[async_training]``: the asynchronous mode and its staleness bound, with verl's keys where they mean
the same (its ``one_step_off_policy`` and ``fully_async_policy`` recipes)."""

from __future__ import annotations

import attrs

from rlcore.plugins.settings import setting
from rlcore.rollout.declared import engine_declares, engines_declaring

MODES = ("auto", "off", "split", "colocated")
ASYNC_MODES = ("split", "colocated")
SHARING = ("auto", "time_slicing", "concurrent")
PRIORITIES = ("equal", "trainer", "engine")


@attrs.frozen
class AsyncConfig:
    mode: str = setting("auto", choices=MODES,
                        doc="auto: colocated on one GPU where the engine and the backend were measured faster "
                            "that way (docs/async.md), else off; chosen at the start of a run, which records the "
                            "choice; off: generate, then train (lockstep); split: a rollout pool of its own devices "
                            "generates ahead while the trainer trains; colocated: each trainer device also runs "
                            "an engine, in a process of its own, one batch ahead")
    max_staleness: int = setting(1, ge=0, doc="policy versions a trained sample may lag the policy that trains "
                                              "on it (0: on-policy, as lockstep; 1: one-step off-policy)")
    device_sharing: str = setting("auto", choices=SHARING,
                                  doc="colocated: how the trainer and the engine share each device; auto: "
                                      "concurrent where the platform was measured faster that way (NVIDIA GPUs, "
                                      "one machine), falling back to time slicing, with its reason, where it "
                                      "cannot start; time_slicing: they take turns, as the driver schedules two "
                                      "processes; concurrent: their kernels run at the same moment (NVIDIA GPUs: a "
                                      "CUDA MPS daemon the job starts, checks and stops), refused where the "
                                      "platform cannot (docs/async.md)")
    trainer_compute_share: float | None = setting(None, gt=0.0, le=1.0,
                                                  doc="colocated, concurrent: the part of each device's compute "
                                                      "units (streaming multiprocessors) the trainer's kernels may "
                                                      "use; unset: chosen at start from the actor's size (0.5 "
                                                      "below 0.7 B parameters, 1.0 from there: "
                                                      "rlcore.asynchronous.arrangement, docs/async.md), the start "
                                                      "line says it; checked at start (60, 70 and 80% computed a "
                                                      "bf16 product wrong under MPS on an H200; 50, 75 and 90% "
                                                      "right, but a job at 75% on an H100 had NaN losses from "
                                                      "step 1); 0.5 and 1.0: the shares whole jobs were measured "
                                                      "and trained right with")
    engine_compute_share: float | None = setting(None, gt=0.0, le=1.0,
                                                 doc="colocated, concurrent: the part of each device's compute "
                                                     "units the engine's kernels may use, checked at start as the "
                                                     "trainer's is; unset: chosen at start (1.0; from 0.7 B "
                                                     "parameters, where training is the longer phase, behind the "
                                                     "trainer's kernels: kernel_priority)")
    kernel_priority: str | None = setting(None, choices=PRIORITIES,
                                          doc="colocated, concurrent: whose kernels the device runs first when the "
                                              "trainer's and the engine's are both waiting; the other side's "
                                              "processes get a below-normal priority (NVIDIA: CUDA MPS client "
                                              "priority, CUDA_MPS_CLIENT_PRIORITY = 1) and still use the compute "
                                              "units the first leaves idle, so it suits compute shares of 1.0; "
                                              "equal: neither; unset: chosen at start from the actor's size "
                                              "(trainer from 0.7 B parameters, where training is the longer "
                                              "phase; else equal: docs/async.md)")
    engines_per_device: int | None = setting(None, ge=1,
                                             doc="colocated: engine processes beside the trainer on each device, "
                                                 "each generating an equal part of the batch with an equal part "
                                                 "of rollout.gpu_memory_utilization; more than one helps an engine "
                                                 "bound by its host's work per token (a small model); unset: "
                                                 "chosen at start from the actor's size (2 below 0.7 B parameters "
                                                 "under concurrent sharing, else 1: docs/async.md); tensor and "
                                                 "data parallel size 1; lockstep leaves a set value unused "
                                                 "(saying so at start), split refuses one above 1")
    rollout_n_gpus_per_node: int = setting(1, ge=1, doc="split: rollout workers per node (their own devices)")
    rollout_nnodes: int = setting(1, ge=1, doc="split: nodes of the rollout pool")
    # verl's keys (async_training.* of its recipes), accepted where they mean what rlcore does
    staleness_threshold: float | None = setting(
        None, ge=0.0, doc="verl's freshness control: a whole number k is max_staleness = k (0: synchronous, 1: "
                          "one-step off-policy); verl's fractions of stale samples are refused")
    trigger_parameter_sync_step: int = setting(1, ge=1, doc="verl: updates between weight syncs; rlcore syncs "
                                                            "after each step's update (only 1 is accepted)")
    partial_rollout: bool = setting(False, doc="a weight sync reaches generations in flight: the engine takes the "
                                               "new weights between two of its steps, its running requests "
                                               "compute their cache again and go on under them (engines that "
                                               "declare takes_weights_mid_generation; tensor parallel 1); off: "
                                               "a generation ends under the weights it started with (verl: "
                                               "partial_rollout)")
    require_batches: int = setting(1, ge=1, doc="verl: mini-batches fetched at once; rlcore trains whole "
                                                "batches of data.train_batch_size (only 1 is accepted)")

    @property
    def enabled(self) -> bool:
        """An asynchronous form was asked for (``auto`` is neither until a run resolves it)."""
        return self.mode in ASYNC_MODES

    @property
    def staleness(self) -> int:
        """The bound in policy versions: ``staleness_threshold`` when verl's key is set, else ``max_staleness``."""
        return int(self.staleness_threshold) if self.staleness_threshold is not None else self.max_staleness


def first_kernels(section: AsyncConfig) -> str:
    """``kernel_priority``; unset only where no arrangement ran (lockstep, the split form): equal."""
    return section.kernel_priority or "equal"


def async_problems(job) -> list[str]:
    """Errors of an ``[async_training]`` table, each naming its key and what is expected (the engine's
    declarations are read from the job's plugin registry); registered by ``rlcore.asynchronous.plugin``."""
    config, set_keys, manager = job.config, job.set_keys, job.manager
    if "async_training" not in config.sections:  # a manager without the core's plugins (some tests)
        return []
    section: AsyncConfig = config.section("async_training")
    errors = []
    threshold = section.staleness_threshold
    if threshold is not None and threshold != int(threshold):
        errors.append(f"async_training.staleness_threshold = {threshold}: verl's fraction of stale samples has no "
                      "rlcore equivalent; rlcore bounds the lag of every sample in whole policy versions "
                      "(async_training.max_staleness; staleness_threshold = 0 or 1 maps onto it)")
    if threshold is not None and "async_training.max_staleness" in set_keys and int(threshold) != section.max_staleness:
        errors.append(f"async_training.staleness_threshold = {threshold:g} and async_training.max_staleness = "
                      f"{section.max_staleness} disagree; set one of them")
    if section.trigger_parameter_sync_step != 1:
        errors.append(f"async_training.trigger_parameter_sync_step = {section.trigger_parameter_sync_step}: rlcore "
                      "syncs weights after each step's update; more optimizer steps per sync come from "
                      "actor.ppo_mini_batch_size < data.train_batch_size")
    if section.require_batches != 1:
        errors.append(f"async_training.require_batches = {section.require_batches}: rlcore trains whole batches of "
                      "data.train_batch_size prompts; set data.train_batch_size instead")
    if section.partial_rollout and section.mode == "off":
        errors.append("async_training.partial_rollout = true with async_training.mode = 'off': in lockstep no "
                      "generation runs while the weights change; set mode = 'split' or 'colocated', or "
                      "partial_rollout = false")
    elif section.partial_rollout:
        errors += partial_rollout_problems(config, manager)
    errors += engines_per_device_problems(config, section)
    if not section.enabled:  # off, or auto, which turns lockstep where these are on
        return errors
    if not config.trainer.ray:  # else Ray would start a default instance of its own at the first actor
        errors.append(f"async_training.mode = {section.mode!r} runs its rollout workers as Ray actors, but "
                      "trainer.ray = false runs no Ray; set trainer.ray = true, or mode = 'off' (lockstep, "
                      "which runs in this process)")
    if section.device_sharing == "concurrent" and (config.trainer.nnodes > 1 or config.trainer.ray_address):
        errors.append("async_training.device_sharing = 'concurrent' starts its sharing (CUDA MPS) on this machine "
                      "only; with trainer.nnodes > 1 or trainer.ray_address set, use 'time_slicing'")
    ordered = section.kernel_priority not in (None, "equal")
    if ordered and (section.device_sharing == "time_slicing" or section.mode == "split"):
        why = ("device_sharing = 'time_slicing' runs one process's kernels at a time" if section.mode != "split" else
               "mode = 'split' gives the engines devices of their own")
        errors.append(f"async_training.kernel_priority = {section.kernel_priority!r} orders the trainer's and the "
                      f"engine's kernels on a device they share at the same moment, and {why}; set "
                      "kernel_priority = 'equal', or mode = 'colocated' with device_sharing = 'auto' or 'concurrent'")
    if section.device_sharing == "concurrent" and section.mode == "split":
        errors.append("async_training.device_sharing = 'concurrent' is for the colocated form (an engine beside "
                      "the trainer on each device); mode = 'split' gives the engines devices of their own")
    for what in unsupported_features(config):
        errors.append(f"async_training.mode = {section.mode!r} does not support {what} yet; use mode = 'off'")
    return errors


def engines_per_device_problems(config, section: AsyncConfig) -> list[str]:
    """``engines_per_device > 1``: the colocated form (or ``auto``, which may become it), engines of one device
    each."""
    count = section.engines_per_device
    if count is None or count == 1 or section.mode == "off":  # lockstep leaves it unused, and says so at start (unused_engines_note)
        return []
    if section.mode == "split":
        return [f"async_training.engines_per_device = {count} is for the colocated form, and mode = 'split': the "
                "split form gives the engines devices of their own (async_training.rollout_n_gpus_per_node); set "
                "mode = 'colocated', or engines_per_device = 1"]
    rollout = config.rollout
    if rollout.tensor_model_parallel_size > 1 or rollout.data_parallel_size > 1:
        return [f"async_training.engines_per_device = {count} with rollout.tensor_model_parallel_size = "
                f"{rollout.tensor_model_parallel_size} and rollout.data_parallel_size = {rollout.data_parallel_size}: "
                "engines sharing a device each run on that device alone; set both to 1, or engines_per_device = 1"]
    return []


def unused_engines_note(config) -> str | None:
    """What a lockstep job says of ``engines_per_device > 1`` (a job file written for the colocated form, run
    with mode = 'off'): the engine lives in the trainer's process, so the setting goes unused. None for a job
    without the section or that uses it."""
    if "async_training" not in config.sections:
        return None
    section = config.section("async_training")
    if section.mode != "off" or section.engines_per_device in (None, 1):
        return None
    return (f"async_training.engines_per_device = {section.engines_per_device} goes unused (it is the colocated "
            "form's; in lockstep the engine lives in the trainer's process)")


def unsupported_features(config) -> list[str]:
    """The job's features the asynchronous controller lacks, each named by its key."""
    agent = config.section("rollout.agent") if "rollout.agent" in config.sections else None
    features = [(config.algorithm.filter_groups.enable, "algorithm.filter_groups.enable (dynamic sampling)"),
                ("rollout.multi_turn" in config.sections and config.section("rollout.multi_turn").enable,
                 "rollout.multi_turn.enable (multi-turn rollouts)"),
                (agent is not None and agent.enabled, f"{agent.key if agent else 'rollout.agent'} (agent episodes)"),
                (config.trainer.critic_warmup > 0, "trainer.critic_warmup > 0")]
    return [what for on, what in features if on]


def partial_rollout_problems(config, manager) -> list[str]:
    """``partial_rollout = true``: an engine that takes weights between its steps, one engine per rank."""
    rollout, problems = config.rollout, []
    if manager is not None and rollout.name in manager.registry("rollout_engines") and not engine_declares(
            manager, rollout.name, "takes_weights_mid_generation"):
        able = engines_declaring(manager, "takes_weights_mid_generation")
        problems.append(f"async_training.partial_rollout = true: the {rollout.name!r} rollout engine cannot take new "
                        f"weights in the middle of a generation; use rollout.name = one of "
                        f"{', '.join(map(repr, able)) or '(none installed)'}, or partial_rollout = false")
    if rollout.tensor_model_parallel_size > 1:
        problems.append(f"async_training.partial_rollout = true with rollout.tensor_model_parallel_size = "
                        f"{rollout.tensor_model_parallel_size}: the ranks of one engine would take new weights at "
                        "different steps; partial rollouts need tensor_model_parallel_size = 1")
    return problems
