"""The training-backend contract: what the core asks of a backend, a built-in plugin's or a third party's.

A backend is registered by name (``rlcore_register_training_backends``, ``trainer.backend``) as an
instance of a ``TrainingBackend`` subclass. Its capabilities are declared members with defaults here,
so the core reads them one way (``backend.supports_lora``), never through ``getattr(..., default)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from rlcore.algorithms.bypass import bypass_policy_loss
from rlcore.algorithms.distillation import TOP_K_LOSS, resolve_distillation
from rlcore.errors import RlcoreError
from rlcore.training.specs import ActorAlgorithms, ActorSpec, CriticSpec, ReferenceSpec, TrainingSpec

if TYPE_CHECKING:
    from rlcore.runtime.platforms import Platform
    from rlcore.training.roles import Actor, Critic, Reference

# JobConfig (rlcore.config.schema) is named in hints, never imported: the configuration stands above this.


def resolve_actor_algorithms(config: JobConfig, manager, *, old_log_probs_in_update: bool = False) -> ActorAlgorithms:
    """The policy loss (in verl's bypass mode with rollout correction, ``BypassCorrection``
    around it), (with ``actor.use_kl_loss``) the KL estimator and (with
    ``distillation.enable``) the distillation objects that ``config`` names; where the update's own
    forward pass gives the old log-probs (``old_log_probs_in_update``, no separate pass), the rollout
    correction that weighs each micro-batch."""
    actor, algorithm = config.actor, config.algorithm
    in_update = old_log_probs_in_update and algorithm.rollout_is_threshold is not None and not algorithm.rollout_bypass
    return ActorAlgorithms(
        rollout_correction=algorithm if in_update else None,
        # in bypass mode with rollout correction, wrapped to correct each micro-batch (rlcore.algorithms.bypass)
        policy_loss=bypass_policy_loss(config.algorithm, manager.get("policy_losses", actor.policy_loss)),
        kl_estimator=manager.get("kl_estimators", actor.kl_loss_type) if actor.use_kl_loss else None,
        distillation=resolve_distillation(config, manager),
    )


class TrainingBackend(ABC):
    """Builds the actor, reference and critic roles of one worker process.

    Each builder receives its role's spec (``rlcore.api.ActorSpec``, ``ReferenceSpec``, ``CriticSpec``:
    the settings, plans and resolved loss objects the driver computed for that role, never the whole
    job) and the platform of the process. Capabilities are class attributes a subclass overrides."""

    name: str = ""
    # model.lora_rank / critic.model.lora_rank: the backend trains LoRA adapters
    supports_lora: bool = False
    # actor/ref/critic.ulysses_sequence_parallel_size > 1: the backend splits packed sequences over ranks
    supports_sequence_parallel: bool = False
    # model.override_config: the backend sets those values over the model's Hugging Face config
    applies_model_override_config: bool = False
    # actor.calculate_sum_pi_squared: the actor's old log-prob pass also returns ``sum_pi_squared`` (B, R)
    supports_sum_pi_squared: bool = False
    # distillation.loss = forward_kl_topk: the reference (teacher) also returns ``ref_topk_ids`` and
    # ``ref_topk_log_probs`` (B, R, K), and the actor gives ``micro_batch_actor_loss`` a ``StudentTopK``
    supports_top_k_distillation: bool = False
    # actor.router_replay: the actor's passes route a mixture of experts' tokens as the batch column
    # ``routed_experts`` (B, P+R, L, K) says (expert ids per position, MoE layer and choice, aligned with
    # ``input_ids``; entries < 0: the router's own choice); with "R2" the old log-prob pass adds that
    # column, recorded from its own routing; with "R3" the rollout engine's rows carry it
    replays_routing: bool = False
    # async_training.mode = "auto" runs the colocated form on one device with this backend (and an engine
    # declaring the same): set where that was measured faster than lockstep (docs/async.md, "One GPU")
    colocated_faster_on_one_device: bool = False
    # rows with images (``multi_modal_inputs``, rlcore.data.vision): the actor and reference forward a
    # vision-language model's image inputs with the token ids
    takes_images: bool = False
    # algorithm.adv_estimator needing a critic (gae): the backend builds a value model (``critic``)
    builds_critic: bool = True
    # modules that must import before a job on this backend starts (checked by rlcore.runs.preflight)
    requires: tuple[str, ...] = ()
    # what the end-of-run summary prints to turn a checkpoint into a Hugging Face folder;
    # ``{checkpoint}`` is replaced by the checkpoint's folder. None: the backend has no export.
    export_command: str | None = None

    @abstractmethod
    def actor(self, spec: ActorSpec, platform: Platform) -> Actor:
        """The policy, training with ``spec.algorithms``."""

    @abstractmethod
    def reference(self, spec: ReferenceSpec, platform: Platform) -> Reference:
        """A frozen copy of the initial policy (or a distillation teacher: ``spec.path``)."""

    @abstractmethod
    def critic(self, spec: CriticSpec, platform: Platform) -> Critic:
        """The value model."""

    def data_parallel_ranks(self, spec: TrainingSpec, workers: int) -> list[int]:
        """The data-parallel group of each of ``workers`` ranks of ``spec.role`` ("actor" or "critic"). The
        ranks of one group train on the same rows, each handed a part of them that the backend puts
        together again (a model-parallel group), so an update's batch need only split evenly over the
        groups, not over the workers. Default: every rank is a group of its own."""
        return list(range(workers))

    def describe_layout(self, spec: TrainingSpec, workers: int) -> str | None:
        """How the backend splits the actor's model (``spec``) over its ``workers``, for the role plan
        printed at start (``"tensor parallel 2 x ..."``); None: nothing to say beyond the worker count."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def training_backend(manager, name: str) -> TrainingBackend:
    """The training backend registered as ``name``; an error naming its plugin when the registered
    object is not a ``TrainingBackend``."""
    entry = manager.registry("training_backends").entry(name)
    if isinstance(entry.value, TrainingBackend):
        return entry.value
    raise RlcoreError(
        f"training backend {name!r} registered by {entry.provider} is a {type(entry.value).__name__}; expected "
        "an instance of a rlcore.api.TrainingBackend subclass (actor, reference, critic and the declared "
        "capabilities)"
    )


def _backends_with(manager, capability: str) -> str:
    """What to use instead of a backend that lacks ``capability`` (a declared ``TrainingBackend`` flag)."""
    registry = manager.registry("training_backends")
    able = [name for name in registry.names()
            if isinstance(registry.get(name), TrainingBackend) and getattr(registry.get(name), capability)]
    return f"use trainer.backend = one of {', '.join(map(repr, able))}" if able else "no installed backend does"


def image_forwarding_gap(manager, name: str) -> str | None:
    """"trainer.backend = <name> does not forward images (backends that do: ...)" when the backend registered
    as ``name`` does not declare ``takes_images``; None when it does, or is not a registered backend (reported
    elsewhere). Said by the preflight (a vision-language model's folder) and by the trainer (rows with images)."""
    registry = manager.registry("training_backends")
    if name not in registry or not isinstance(registry.get(name), TrainingBackend) or registry.get(name).takes_images:
        return None
    able = sorted(other for other in registry.names()
                  if isinstance(registry.get(other), TrainingBackend) and registry.get(other).takes_images)
    return f"trainer.backend = {name!r} does not forward images (backends that do: {', '.join(able) or 'none installed'})"


def backend_lacks(config: JobConfig, manager, capability: str, setting: str, does: str,
                  otherwise: str | None = None) -> list[str]:
    """One error when ``trainer.backend`` does not declare ``capability`` (a ``TrainingBackend`` flag) that
    ``setting`` needs: "<setting>: the <name> training backend does not <does>; <the backends that do>,
    or <otherwise>". None when it does, or when it is not registered (reported by the config checks of names)."""
    name = config.trainer.backend
    if name not in manager.registry("training_backends"):
        return []
    try:
        if getattr(training_backend(manager, name), capability):
            return []
    except RlcoreError as exc:
        return [f"trainer.backend: {exc}"]
    instead = _backends_with(manager, capability) + (f", or {otherwise}" if otherwise else "")
    return [f"{setting}: the {name!r} training backend does not {does}; {instead}"]


# --- what the job asks of its training backend (registered by rlcore.builtins) ------------------------


def _lora_settings(config) -> list[tuple[str, str]]:
    settings = [(f"{key} = {rank!r}", key) for key, rank in (("model.lora_rank", config.model.lora_rank),
                                                           ("critic.model.lora_rank", config.critic.model.lora_rank))
                if rank]
    if config.model.lora_adapter_path:
        settings.append((f"model.lora_adapter_path = {config.model.lora_adapter_path!r}", "model.lora_adapter_path"))
    return settings


def _top_k_distillation(config) -> list[tuple[str, str]]:
    return [(f"distillation.loss = {TOP_K_LOSS!r}", "")] if config.distillation.enable and \
        config.distillation.loss == TOP_K_LOSS else []


def _sequence_parallel_sizes(config) -> dict[str, int]:
    sizes = {"actor.ulysses_sequence_parallel_size": config.actor.ulysses_sequence_parallel_size,
             "ref.ulysses_sequence_parallel_size": config.ref.ulysses_sequence_parallel_size,
             "critic.ulysses_sequence_parallel_size": config.critic.ulysses_sequence_parallel_size}
    return {key: size for key, size in sizes.items() if size not in (None, 1)}


# A declared capability, the settings of a job that need it ((setting as shown, its key) pairs), what the
# backend would do, and what else to do ("{key}": the setting's key; None: nothing else).
BACKEND_NEEDS = (
    ("supports_sum_pi_squared",
     lambda c: [("actor.calculate_sum_pi_squared", "")] if c.actor.calculate_sum_pi_squared else [],
     "compute it", None),
    ("supports_top_k_distillation", _top_k_distillation,
     "give the teacher's top-k tokens and the student's log-probs at them",
     "a per-token estimator (distillation.loss = 'k1', 'k3', ...)"),
    ("supports_lora", _lora_settings, "train LoRA adapters", "leave {key} unset"),
    ("applies_model_override_config", lambda c: [("model.override_config", "")] if c.model.override_config else [],
     "set config values over the model's", "edit the model folder's config.json"),
    ("supports_sequence_parallel",
     lambda c: [(f"{key} = {size}", key) for key, size in _sequence_parallel_sizes(c).items()],
     "split sequences (Ulysses sequence parallelism)", "set {key} = 1"),
    ("replays_routing",
     lambda c: [(f"actor.router_replay = {c.actor.router_replay!r}", "")] if c.actor.router_replay != "off" else [],
     "replay a mixture of experts' routing", "set actor.router_replay = 'off'"),
)


def backend_problems(job) -> list[str]:
    """Every setting of the job that needs a capability ``trainer.backend`` does not declare (from
    ``BACKEND_NEEDS``), and what those settings need of the rest of the job."""
    import re

    config, problems = job.config, []
    for capability, settings, does, otherwise in BACKEND_NEEDS:
        for setting, key in settings(config):
            problems += backend_lacks(config, job.manager, capability, setting, does,
                                      otherwise.format(key=key) if otherwise else None)
    problems += _critic_problems(job)
    for key, pattern in (("model.lora_exclude_modules", config.model.lora_exclude_modules),
                         ("critic.model.lora_exclude_modules", config.critic.model.lora_exclude_modules)):
        try:
            re.compile(pattern or "")
        except re.error as exc:
            problems.append(f"{key} = {pattern!r}: expected a regular expression ({exc})")
    trainer = config.trainer
    for key, size in _sequence_parallel_sizes(config).items():
        workers = (config.critic.n_gpus_per_node if key.startswith("critic") and config.critic.n_gpus_per_node
                   else trainer.n_gpus_per_node) * trainer.nnodes
        if not config.model.use_remove_padding:
            problems.append(f"{key} = {size} splits packed rows: set model.use_remove_padding = true "
                            "(verl: actor_rollout_ref.model.use_remove_padding=True)")
        if workers % size:
            problems.append(f"{key} = {size} must divide the {workers} training workers into whole groups")
    return problems


def _critic_problems(job) -> list[str]:
    """An estimator that trains a critic on a backend that declares it builds none (``builds_critic``)."""
    config, manager = job.config, job.manager
    name, backends = config.algorithm.adv_estimator, manager.registry("training_backends")
    estimators = manager.registry("advantage_estimators")
    if name not in estimators or not estimators.get(name).needs_critic or config.trainer.backend not in backends:
        return []
    backend = backends.get(config.trainer.backend)
    if not isinstance(backend, TrainingBackend) or backend.builds_critic:
        return []
    return [f"algorithm.adv_estimator = {name!r} trains a critic, and trainer.backend = {config.trainer.backend!r} "
            f"builds none: use an estimator without one ('grpo', 'rloo', ...), or "
            f"{_backends_with(manager, 'builds_critic')}"]
