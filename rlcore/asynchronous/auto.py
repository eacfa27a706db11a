"""``async_training.mode = "auto"`` (the default): the colocated form where it was measured faster than
lockstep, lockstep everywhere else.

The GSM8K GRPO job (SmolLM2-135M) ran 1.06-2.09x faster colocated (max_staleness 1) than in lockstep on
one H200 or H100 in every sitting (docs/async.md, "One GPU"); at the 1.5B shape 0.94-0.95x with the trainer
at half the SMs under MPS, 1.51x (an H100, 2026-12-07) with one engine and the trainer at every SM, the
trainer's kernels first, the arrangement it now gets (``rlcore.asynchronous.arrangement``). So a job on exactly one
accelerator device, with an engine and a backend that declare the colocated form faster there
(``colocated_faster_on_one_device``: the ones it was measured with) and nothing the asynchronous controller
refuses, runs colocated; every other job runs lockstep. The choice is made once, at the start of
``rlcore train``, and the resolved job is what the run folder records. An explicit mode is never changed.
"""

from __future__ import annotations

import attrs

from rlcore.asynchronous.arrangement import choose_arrangement
from rlcore.asynchronous.config import unsupported_features
from rlcore.plugins.manager import get_manager
from rlcore.rollout.declared import engine_declares

# The correction docs/async.md recommends for stale samples, turned on when the job sets none of its keys.
CORRECTION = {"rollout_is_threshold": 2.0, "rollout_is": True}
CORRECTION_KEYS = ("algorithm.rollout_is", "algorithm.rollout_rs", "algorithm.rollout_bypass")


@attrs.frozen
class ModeChoice:
    """What ``auto`` became and why."""

    mode: str  # "off" or "colocated"
    reason: str
    corrected: bool = False  # auto turned rollout importance sampling on

    @property
    def line(self) -> str:
        """The one line printed at start."""
        settings = ", ".join(f"algorithm.{key} = {str(value).lower()}" for key, value in CORRECTION.items())
        correction = (f"; stale samples corrected: {settings} (set any algorithm.rollout_is* key to choose "
                      "otherwise)" if self.corrected else "")
        return f"async_training.mode = 'auto' -> {self.mode!r}: {self.reason}{correction}"

    def record(self) -> dict:
        """What the run folder's environment.json says about the choice."""
        return {"asked": "auto", "mode": self.mode, "reason": self.reason, "corrected": self.corrected}


def _backend_declares_it(name: str, manager) -> bool:
    from rlcore.training.backends import training_backend  # torch: only when a choice is made

    registered = name in manager.registry("training_backends")
    return registered and training_backend(manager, name).colocated_faster_on_one_device


def choose_mode(config, set_keys: frozenset[str], platform, manager=None) -> ModeChoice:
    """What ``auto`` resolves to for this job on ``platform`` (the driver's)."""
    manager = manager or get_manager()
    trainer = config.trainer
    devices = trainer.nnodes * (trainer.n_gpus_per_node + config.critic.n_gpus_per_node)
    if platform.device_type == "cpu":
        return ModeChoice("off", "lockstep on the CPU (the colocated form was measured faster only on one GPU)")
    if devices != 1:
        return ModeChoice("off", f"lockstep on {devices} devices (trainer.nnodes x (trainer.n_gpus_per_node + "
                                 "critic.n_gpus_per_node)); the colocated default is for one device")
    if trainer.val_only:
        return ModeChoice("off", "lockstep: trainer.val_only = true trains nothing to overlap with")
    if not trainer.ray:
        return ModeChoice("off", "lockstep: trainer.ray = false runs in this process; the colocated form needs Ray")
    if not engine_declares(manager, config.rollout.name, "colocated_faster_on_one_device"):
        return ModeChoice("off", f"lockstep: the {config.rollout.name!r} engine (rollout.name) is not measured "
                                 "faster colocated on one device")
    if not _backend_declares_it(trainer.backend, manager):
        return ModeChoice("off", f"lockstep: the {trainer.backend!r} backend (trainer.backend) is not measured "
                                 "faster colocated on one device")
    refused = unsupported_features(config)
    if refused:
        return ModeChoice("off", f"lockstep: the asynchronous mode does not support {', '.join(refused)}")
    staleness = config.section("async_training").staleness
    user_corrects = any(key.startswith(CORRECTION_KEYS) for key in set_keys)
    if staleness > 0 and not user_corrects and not config.rollout.calculate_log_probs:
        return ModeChoice("off", "lockstep: stale samples need the rollout's log-probs for their correction, and "
                                 "rollout.calculate_log_probs = false")
    reason = colocated_reason(config, platform, choose_arrangement(config, platform).engines_per_device)
    return ModeChoice("colocated", reason, corrected=staleness > 0 and not user_corrects)


def colocated_reason(config, platform, engines: int) -> str:
    """Why ``auto`` became the colocated form, with ``engines`` engines a device (the arrangement's)."""
    staleness, memory = config.section("async_training").staleness, config.rollout.gpu_memory_utilization
    runs = ("the engine runs in a process of its own" if engines == 1 else
            f"{engines} engines (async_training.engines_per_device) run in processes of their own")
    keeps = ("keeps its" if engines == 1 else "keep their")
    share = "" if engines == 1 else f" ({memory / engines:g} each)"
    return (f"one {platform.name} device, {config.rollout.name} engine: {runs} beside the trainer, up to "
            f"{staleness} batch(es) ahead (samples lag by at most {staleness} version(s)), and {keeps} "
            f"rollout.gpu_memory_utilization = {memory:g} of the device{share} while the actor trains")


def resolve_auto(job, platform, manager=None):
    """(the job with ``auto`` replaced by what it chose, the choice); an explicit mode: (job, None)."""
    config = job.config
    if "async_training" not in config.sections or config.section("async_training").mode != "auto":
        return job, None
    choice = choose_mode(config, job.set_keys, platform, manager)
    sections = config.sections | {"async_training": attrs.evolve(config.section("async_training"), mode=choice.mode)}
    algorithm = attrs.evolve(config.algorithm, **CORRECTION) if choice.corrected else config.algorithm
    return attrs.evolve(job, config=attrs.evolve(config, sections=sections, algorithm=algorithm)), choice
