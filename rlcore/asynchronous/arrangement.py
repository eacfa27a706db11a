"""What each device of a colocated job holds beside the trainer, where the job leaves it to rlcore: the
engine processes (``async_training.engines_per_device``) and, under concurrent sharing, the parts of the
device's compute units the trainer's and the engines' kernels may use (``trainer_compute_share``,
``engine_compute_share``) and whose kernels go first (``kernel_priority``). Chosen once, at start, from the
actor's size; a key the job sets is kept.

Whichever phase is the longer should have the device. Measured on one H100 (docs/async.md, "One GPU"), the
GSM8K GRPO job, 64 prompts x 8, <= 512 new tokens, lockstep's phases and the colocated form's step:

- SmolLM2-135M: generation is the longer phase (engine 4.09 s, reference and update 1.72 s). Two engines
  with all the compute units, the trainer at half: 3.07 s a step, 2.09x lockstep's samples/s (20 steps).
- The Qwen2.5-1.5B shape (1.39 B parameters): training is (engine 7.50 s, trainer 8.70 s). One engine and
  the trainer both at every compute unit, the trainer's kernels first (the engine's process at MPS's
  below-normal client priority, so it runs in what the trainer leaves, and on the whole device while the
  trainer waits for its batch): 11.17 s a step, 1.51x lockstep. Two engines at every unit, equal priority:
  1.41x; the trainer at every unit and two engines at half: 1.31x (earlier); one engine at half: 1.32x
  (an H200). The trainer at half: 0.94x.

The ratio of training to generation time grows with the size (0.42 at 135M, 1.39 at 1.39 B); interpolated
in the logarithm of the size it crosses 1 near 0.7 B parameters, ``TRAINING_BOUND_PARAMETERS``. Jobs on more
than one device, platforms whose concurrent sharing is not declared faster, and jobs that take turns on the
device keep one engine a device with the trainer at half (the form before; two engines a device need the
rollout's tensor and data parallel size 1, which one device gives). So do jobs under ``device_sharing =
"auto"`` that will take turns: where that shows beforehand (``auto_takes_turns``: no MPS control program in a
container, a Ray cluster) the arrangement is chosen so; where the sharing then fails to start (the daemon
refuses, a client check fails) the trainer chooses again before its workers start, ``turns`` saying why.
"""

from __future__ import annotations

import os

import attrs

from rlcore.errors import RlcoreError
from rlcore.models.loading import resolve_model_path
from rlcore.models.size import parameter_count

TRAINING_BOUND_PARAMETERS = 0.7e9
KEYS = ("engines_per_device", "trainer_compute_share", "engine_compute_share", "kernel_priority")


@attrs.frozen
class Arrangement:
    engines_per_device: int
    trainer_compute_share: float
    engine_compute_share: float
    kernel_priority: str
    reason: str

    def settings(self) -> dict:
        return {key: getattr(self, key) for key in KEYS}

    @property
    def line(self) -> str:
        """The one line printed at start."""
        return (f"colocated arrangement: async_training.engines_per_device = {self.engines_per_device}, "
                f"trainer_compute_share = {self.trainer_compute_share:g}, engine_compute_share = "
                f"{self.engine_compute_share:g}, kernel_priority = {self.kernel_priority!r}: {self.reason}")


GENERATION_BOUND = dict(engines_per_device=2, trainer_compute_share=0.5, engine_compute_share=1.0,
                        kernel_priority="equal")
TRAINING_BOUND = dict(engines_per_device=1, trainer_compute_share=1.0, engine_compute_share=1.0,
                      kernel_priority="trainer")
ONE_ENGINE = dict(engines_per_device=1, trainer_compute_share=0.5, engine_compute_share=1.0, kernel_priority="equal")


def actor_parameters(config) -> int | None:
    """The actor model's parameters from its safetensors headers, or None where they cannot be read."""
    try:
        return parameter_count(resolve_model_path(config.model.path))
    except (RlcoreError, OSError):  # a hub id offline, ...: decided without the size, and said so
        return None


def by_size(parameters: int | None) -> tuple[dict, str]:
    """What one device holds beside an actor of ``parameters`` under concurrent sharing, and why."""
    if parameters is None:
        return ONE_ENGINE, ("one engine, the trainer at half the compute units: the actor's size could not be read "
                            "from safetensors weights in model.path")
    size = f"{parameters / 1e9:.2f} B"
    if parameters < TRAINING_BOUND_PARAMETERS:
        return GENERATION_BOUND, (f"an actor of {size} parameters (< 0.7 B): generation is the longer phase, so two "
                                  "engines with all the compute units, the trainer with half")
    return TRAINING_BOUND, (f"an actor of {size} parameters (>= 0.7 B): training is the longer phase, so the "
                            "trainer's kernels first at all the compute units, one engine in what they leave")


def auto_takes_turns(config, platform) -> str | None:
    """Why ``async_training.device_sharing = "auto"`` takes turns on this job and machine, as far as shows
    without starting the sharing; None where it tries to run the trainer's and the engine's kernels at once."""
    if not platform.concurrent_sharing_faster:
        return f"the {platform.name} platform's concurrent sharing is not measured faster than taking turns"
    trainer = config.trainer
    if trainer.nnodes > 1 or trainer.ray_address or os.environ.get("RAY_ADDRESS"):
        return ("the sharing starts on this machine only, and the job runs on a Ray cluster (trainer.nnodes, "
                "trainer.ray_address or RAY_ADDRESS)")
    return platform.device_sharing_missing()


def choose_arrangement(config, platform, turns: str | None = None) -> Arrangement:
    """What the job's colocated devices hold: its own settings where it set them, else the measured choice;
    ``turns``: why an ``auto`` sharing that was tried takes turns after all."""
    section, trainer = config.section("async_training"), config.trainer
    if not platform.concurrent_sharing_faster or section.device_sharing == "time_slicing":
        base, reason = ONE_ENGINE, ("one engine: the arrangements by model size were measured with concurrent "
                                    "sharing on NVIDIA GPUs")
    elif trainer.nnodes * trainer.n_gpus_per_node != 1:
        base, reason = ONE_ENGINE, ("one engine a device: the arrangements by model size were measured on one "
                                    "device")
    elif section.device_sharing == "auto" and (turns := turns or auto_takes_turns(config, platform)):
        base, reason = ONE_ENGINE, (f"one engine: the processes will take turns on the device, {turns} "
                                    "(async_training.device_sharing = 'auto')")
    else:
        base, reason = by_size(actor_parameters(config))
    values = {key: getattr(section, key) if getattr(section, key) is not None else base[key] for key in KEYS}
    kept = [key for key in KEYS if getattr(section, key) is not None]
    if kept:
        reason += f" ({', '.join(f'{key} = {_shown(getattr(section, key))}' for key in kept)} as the job sets)"
    return Arrangement(**values, reason=reason)


def _shown(value) -> str:
    return repr(value) if isinstance(value, str) else f"{value:g}"


def arranged(job, platform, turns: str | None = None):
    """(the job with its unset arrangement keys filled, the arrangement); (job, None) where it is not
    colocated or set them all. ``turns``: as ``choose_arrangement``'s."""
    config = job.config
    if "async_training" not in config.sections:
        return job, None
    section = config.section("async_training")
    if section.mode != "colocated" or all(getattr(section, key) is not None for key in KEYS):
        return job, None
    arrangement = choose_arrangement(config, platform, turns)
    sections = config.sections | {"async_training": attrs.evolve(section, **arrangement.settings())}
    return attrs.evolve(job, config=attrs.evolve(config, sections=sections)), arrangement
