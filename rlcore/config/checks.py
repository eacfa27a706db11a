"""The checks of a whole job: the rules that span tables (names resolve, batch sizes divide) here,
and every component's own, registered with ``rlcore_register_job_checks`` and gathered into one report."""

from __future__ import annotations

from rlcore.batch import mini_batch_rows
from rlcore.config.schema import JobConfig
from rlcore.errors import PluginError, RlcoreError, UnknownNameError
from rlcore.plugins.settings import CheckedJob, JobCheck
from rlcore.training.specs import training_spec

# (TOML path, registry kind) for every setting that names a registered implementation.
NAMED_SETTINGS = (
    ("trainer.backend", "training_backends"),
    ("rollout.name", "rollout_engines"),
    ("algorithm.adv_estimator", "advantage_estimators"),
    ("actor.policy_loss", "policy_losses"),
    ("actor.kl_loss_type", "kl_estimators"),
    ("algorithm.kl_penalty", "kl_estimators"),
    ("distillation.policy_loss", "policy_losses"),
)


def _value(config: JobConfig, path: str):
    node = config
    for part in path.split("."):
        node = getattr(node, part)
    return node


def _names(config: JobConfig, manager) -> list[str]:
    errors = []
    for path, kind in NAMED_SETTINGS:
        if _value(config, path) is None:
            continue  # unset, and no plugin declares a default: reported by load_job
        try:
            manager.registry(kind).entry(_value(config, path))
        except UnknownNameError as exc:
            errors.append(f"{path}: {exc}")
    for index, name in enumerate(config.trainer.logger):
        try:
            manager.registry("loggers").entry(name)
        except UnknownNameError as exc:
            errors.append(f"trainer.logger[{index}]: {exc}")
    return errors


def needs_critic(config: JobConfig, manager) -> bool:
    registry = manager.registry("advantage_estimators")
    name = config.algorithm.adv_estimator
    return name in registry and registry.get(name).needs_critic


def _batch_sizes(config: JobConfig, manager) -> list[str]:
    """A step's prompts split into whole mini-batches, and each mini-batch's samples evenly over the
    data-parallel groups of its role's workers and into whole micro-batches."""
    errors = []
    data, actor, rollout, trainer = config.data, config.actor, config.rollout, config.trainer
    workers = trainer.n_gpus_per_node * trainer.nnodes
    if data.train_batch_size % actor.ppo_mini_batch_size:
        errors.append(f"data.train_batch_size ({data.train_batch_size}) must be a multiple of "
                      f"actor.ppo_mini_batch_size ({actor.ppo_mini_batch_size})")
    samples = actor.ppo_mini_batch_size * rollout.n
    groups = _data_parallel_groups(config, manager, "actor", workers)
    try:
        per_group = mini_batch_rows(actor.ppo_mini_batch_size, rollout.n, groups, "actor")
    except RlcoreError:
        errors.append(f"actor.ppo_mini_batch_size x rollout.n ({actor.ppo_mini_batch_size} x {rollout.n} = {samples}) "
                      f"must divide evenly over {_over(groups, workers, 'trainer.n_gpus_per_node x trainer.nnodes')}")
        per_group = None
    if per_group is not None and actor.ppo_micro_batch_size_per_gpu and not actor.use_dynamic_bsz:
        divisor = "workers" if groups == workers else f"{groups} data-parallel groups"
        if per_group % actor.ppo_micro_batch_size_per_gpu:
            errors.append(f"each data-parallel rank's share of a mini-batch ({per_group} samples = "
                          f"actor.ppo_mini_batch_size x rollout.n / {divisor}) must be a multiple of "
                          f"actor.ppo_micro_batch_size_per_gpu ({actor.ppo_micro_batch_size_per_gpu})")
    critic_workers = config.critic.n_gpus_per_node * trainer.nnodes
    if critic_workers and needs_critic(config, manager):
        critic_prompts = config.critic.ppo_mini_batch_size or actor.ppo_mini_batch_size
        critic_samples = critic_prompts * rollout.n
        critic_groups = _data_parallel_groups(config, manager, "critic", critic_workers)
        try:
            mini_batch_rows(critic_prompts, rollout.n, critic_groups, "critic")
        except RlcoreError:
            errors.append(f"the critic's mini-batch ({critic_samples} samples = critic.ppo_mini_batch_size x rollout.n) "
                          f"must divide evenly over "
                          f"{_over(critic_groups, critic_workers, 'critic.n_gpus_per_node x trainer.nnodes')}")
    return errors


def _data_parallel_groups(config: JobConfig, manager, role: str, workers: int) -> int:
    """How many data-parallel groups the backend makes of ``role``'s workers: an update's mini-batch
    must split evenly over those (``TrainingBackend.data_parallel_ranks``), not over every worker."""
    registry = manager.registry("training_backends")
    name = config.trainer.backend
    backend = registry.get(name) if name in registry else None
    if not callable(getattr(backend, "data_parallel_ranks", None)):
        return workers  # an unknown backend is reported by _names, one of another type where it is built
    return len(set(backend.data_parallel_ranks(training_spec(config, role), workers)))


def _over(groups: int, workers: int, sizes: str) -> str:
    """The divisor named in a batch-size error: the workers, or their data-parallel groups."""
    if groups == workers:
        return f"{sizes} ({workers}) workers"
    return f"the {groups} data-parallel groups of {sizes} ({workers}) workers"


def registered_checks(manager, machine: bool = False) -> list[tuple[str, JobCheck]]:
    """The job checks the plugins registered (``machine``: those of this machine too), in load order."""
    checks = []
    for entry in manager.registry("job_checks").entries():
        if not isinstance(entry.value, JobCheck):
            raise PluginError(f"job check {entry.name!r} registered by {entry.provider} is a "
                              f"{type(entry.value).__name__}; expected an rlcore.api.JobCheck")
        if machine or not entry.value.machine:
            checks.append((entry.name, entry.value))
    return checks


def check_job(config: JobConfig, set_keys: frozenset[str], manager, machine: bool = False
              ) -> tuple[list[str], list[str]]:
    """(errors, warnings) for a structurally valid config: the rules across tables, then every
    registered check's (``machine``: the checks of files, folders and disk too)."""
    job = CheckedJob(config, set_keys, manager)
    errors, warnings = _names(config, manager) + _batch_sizes(config, manager), []
    for _, check in registered_checks(manager, machine):
        errors += check.problems(job) if check.problems else []
        warnings += check.unused(job) if check.unused else []
    return errors, warnings
