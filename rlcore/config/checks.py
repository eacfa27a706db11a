"""Checks that span fields or need the plugins: names resolve, batch sizes divide, settings matter."""

from __future__ import annotations

import re

from rlcore.algorithms import distillation, rollout_correction
from rlcore.backends import TrainingBackend, backend_lacks
from rlcore.config.schema import JobConfig
from rlcore.errors import RlcoreError, UnknownNameError
from rlcore.rewards import config as reward_config
from rlcore.rollout.declared import engine_declares, engines_declaring

# (TOML path, registry kind) for every setting that names a registered implementation.
NAMED_SETTINGS = (
    ("trainer.backend", "training_backends"),
    ("rollout.name", "rollout_engines"),
    ("algorithm.adv_estimator", "advantage_estimators"),
    ("actor.policy_loss", "policy_losses"),
    ("actor.kl_loss_type", "kl_estimators"),
    ("algorithm.kl_penalty", "kl_estimators"),
    ("distillation.loss", "kl_estimators"),
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
        if path == "distillation.loss" and _value(config, path) == distillation.TOP_K_LOSS:
            continue  # not an estimator: the top-k loss, checked by _top_k_distillation
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
    errors = []
    data, actor, rollout, trainer = config.data, config.actor, config.rollout, config.trainer
    workers = trainer.n_gpus_per_node * trainer.nnodes
    if data.train_batch_size % actor.ppo_mini_batch_size:
        errors.append(
            f"data.train_batch_size ({data.train_batch_size}) must be a multiple of "
            f"actor.ppo_mini_batch_size ({actor.ppo_mini_batch_size})"
        )
    samples = actor.ppo_mini_batch_size * rollout.n
    groups = _data_parallel_groups(config, manager, "actor", workers)
    if samples % groups:
        errors.append(
            f"actor.ppo_mini_batch_size x rollout.n ({actor.ppo_mini_batch_size} x {rollout.n} = {samples}) "
            f"must divide evenly over {_over(groups, workers, 'trainer.n_gpus_per_node x trainer.nnodes')}"
        )
    elif actor.ppo_micro_batch_size_per_gpu and not actor.use_dynamic_bsz:
        per_group = samples // groups
        divisor = "workers" if groups == workers else f"{groups} data-parallel groups"
        if per_group % actor.ppo_micro_batch_size_per_gpu:
            errors.append(
                f"each data-parallel rank's share of a mini-batch ({per_group} samples = actor.ppo_mini_batch_size x "
                f"rollout.n / {divisor}) must be a multiple of "
                f"actor.ppo_micro_batch_size_per_gpu ({actor.ppo_micro_batch_size_per_gpu})"
            )
    critic_workers = config.critic.n_gpus_per_node * trainer.nnodes
    if critic_workers and needs_critic(config, manager):
        critic_samples = (config.critic.ppo_mini_batch_size or actor.ppo_mini_batch_size) * rollout.n
        critic_groups = _data_parallel_groups(config, manager, "critic", critic_workers)
        if critic_samples % critic_groups:
            errors.append(
                f"the critic's mini-batch ({critic_samples} samples = critic.ppo_mini_batch_size x rollout.n) "
                f"must divide evenly over "
                f"{_over(critic_groups, critic_workers, 'critic.n_gpus_per_node x trainer.nnodes')}")
    if rollout.tensor_model_parallel_size > workers:
        errors.append(
            f"rollout.tensor_model_parallel_size ({rollout.tensor_model_parallel_size}) cannot exceed the "
            f"number of workers ({workers})"
        )
    errors += _engine_parallelism(rollout, workers)
    low = actor.clip_ratio_low if actor.clip_ratio_low is not None else actor.clip_ratio
    losses = manager.registry("policy_losses")
    loss = losses.get(actor.policy_loss) if actor.policy_loss in losses else None
    if low >= 1.0 and not getattr(loss, "unbounded_lower_clip", False):
        errors.append(f"actor.clip_ratio_low (or clip_ratio) must be < 1, got {low}")
    aggregation = getattr(loss, "aggregation", None)
    if aggregation is not None and actor.loss_agg_mode != aggregation:
        errors.append(f"actor.policy_loss = {actor.policy_loss!r} aggregates per sequence: set actor.loss_agg_mode "
                      f"= {aggregation!r} (got {actor.loss_agg_mode!r})")
    for section, optim in (("actor.optim", actor.optim), ("critic.optim", config.critic.optim)):
        if optim.min_lr is not None and optim.min_lr > optim.lr:
            errors.append(f"{section}.min_lr ({optim.min_lr}) is the floor the cosine schedule decays to: it cannot "
                          f"be above {section}.lr ({optim.lr})")
    if config.reward.overlong_buffer.enable and config.reward.overlong_buffer.len >= data.max_response_length:
        errors.append(
            f"reward.overlong_buffer.len ({config.reward.overlong_buffer.len}) must be smaller than "
            f"data.max_response_length ({data.max_response_length})"
        )
    return errors


def _data_parallel_groups(config: JobConfig, manager, role: str, workers: int) -> int:
    """How many data-parallel groups the backend makes of ``role``'s workers: an update's mini-batch
    must split evenly over those (``TrainingBackend.data_parallel_ranks``), not over every worker."""
    registry = manager.registry("training_backends")
    name = config.trainer.backend
    if name not in registry or not isinstance(registry.get(name), TrainingBackend):
        return workers  # an unknown backend is reported by _names, one of another type where it is built
    return len(set(registry.get(name).data_parallel_ranks(config, role, workers)))


def _over(groups: int, workers: int, sizes: str) -> str:
    """The divisor named in a batch-size error: the workers, or their data-parallel groups."""
    if groups == workers:
        return f"{sizes} ({workers}) workers"
    return f"the {groups} data-parallel groups of {sizes} ({workers}) workers"


def _engine_parallelism(rollout, workers: int) -> list[str]:
    """verl's rule for the inference engine's expert parallelism: the experts are split over all the
    engine's ranks (tensor x data parallel), or not at all."""
    tp, dp, ep = rollout.tensor_model_parallel_size, rollout.data_parallel_size, rollout.expert_parallel_size
    errors = []
    if tp * dp > workers:
        errors.append(f"rollout.tensor_model_parallel_size x data_parallel_size ({tp} x {dp}) cannot exceed the "
                      f"number of workers ({workers})")
    if ep not in (1, tp * dp):
        errors.append(f"rollout.expert_parallel_size ({ep}) must be 1 or tensor_model_parallel_size x "
                      f"data_parallel_size ({tp} x {dp} = {tp * dp}): the engine splits the experts over all its ranks")
    return errors


def _algorithm(config: JobConfig, manager) -> list[str]:
    registry = manager.registry("advantage_estimators")
    name = config.algorithm.adv_estimator
    if name not in registry:
        return []  # reported by _names
    estimator = registry.get(name)
    errors = []
    algorithm = config.algorithm
    if estimator.needs_reward_components and not algorithm.gdpo_reward_keys:
        errors.append(f"algorithm.adv_estimator = {name!r} normalises each reward component on its own: set "
                      "algorithm.gdpo_reward_keys to the keys of the reward function's returned dict that hold them")
    weights = algorithm.gdpo_reward_weights
    if weights is not None and len(weights) != len(algorithm.gdpo_reward_keys):
        errors.append(f"algorithm.gdpo_reward_weights has {len(weights)} weight(s) for "
                      f"{len(algorithm.gdpo_reward_keys)} key(s) of algorithm.gdpo_reward_keys: give one per key")
    if estimator.needs_sum_pi_squared and not config.actor.calculate_sum_pi_squared:
        errors.append(f"algorithm.adv_estimator = {name!r} weighs each position by 1 - 2 pi + sum pi^2 from the "
                      "actor's log-prob pass: set actor.calculate_sum_pi_squared = true")
    if config.actor.calculate_sum_pi_squared:
        errors += _sum_pi_squared(config, manager)
    errors += reward_config.problems(config)
    return errors + rollout_correction.problems(config)


def _sum_pi_squared(config: JobConfig, manager) -> list[str]:
    """actor.calculate_sum_pi_squared: a backend that computes it, and an old log-prob pass to do it in."""
    errors = []
    if config.algorithm.rollout_bypass:
        errors.append("actor.calculate_sum_pi_squared comes from the old log-prob pass, which bypass mode "
                      "(algorithm.rollout_bypass) skips: leave one of them off")
    return errors + backend_lacks(config, manager, "supports_sum_pi_squared", "actor.calculate_sum_pi_squared",
                                   "compute it")


def _ineffective(config: JobConfig, set_keys: frozenset[str], manager) -> list[str]:
    def given(prefix: str) -> list[str]:
        return sorted(k for k in set_keys if k == prefix or k.startswith(prefix + "."))

    # a table's own key ("critic.optim" for a [critic.optim] table): its settings are reported one by one
    tables = {key for key in set_keys if any(other.startswith(key + ".") for other in set_keys)}
    warnings = []
    estimators = manager.registry("advantage_estimators")
    name = config.algorithm.adv_estimator
    distilling_only = config.distillation.enable and not config.distillation.use_task_rewards
    if name in estimators and estimators.get(name).needs_groups and config.rollout.n < 2 and not distilling_only:
        warnings.append(f"algorithm.adv_estimator = {name!r} compares samples within a group, but rollout.n = "
                        f"{config.rollout.n}: each sample is a group of its own, whose advantage is its raw score "
                        "(no baseline), as in verl; set rollout.n >= 2 for a group baseline")
    if not config.actor.use_kl_loss:
        for key in given("actor.kl_loss_coef") + given("actor.kl_loss_type"):
            warnings.append(f"{key} has no effect while actor.use_kl_loss is false")
    if not config.algorithm.use_kl_in_reward:
        for key in given("algorithm.kl_ctrl") + given("algorithm.kl_penalty"):
            if key != "algorithm.kl_ctrl":
                warnings.append(f"{key} has no effect while algorithm.use_kl_in_reward is false")
    warnings += rollout_correction.unused_weight_settings(config, given)
    if config.algorithm.adv_estimator in estimators and not estimators.get(
            config.algorithm.adv_estimator).needs_reward_components:
        for key in given("algorithm.gdpo_reward_keys") + given("algorithm.gdpo_reward_weights"):
            warnings.append(f"{key} has no effect: algorithm.adv_estimator = {config.algorithm.adv_estimator!r} "
                            "reads the summed score")
    if config.algorithm.adv_estimator in manager.registry("advantage_estimators") and not needs_critic(
        config, manager
    ):
        for key in given("critic"):
            if key not in tables:
                warnings.append(
                    f"{key} has no effect: algorithm.adv_estimator = "
                    f"{config.algorithm.adv_estimator!r} runs without a critic"
                )
    warnings += rollout_correction.unused_bypass_settings(config, given)
    warnings += reward_config.unused_settings(config, given)
    for section, optim in (("actor.optim", config.actor.optim), ("critic.optim", config.critic.optim)):
        if optim.lr_scheduler == "constant":
            for key in given(f"{section}.min_lr") + given(f"{section}.min_lr_ratio"):
                warnings.append(f"{key} has no effect while {section}.lr_scheduler is 'constant' (it is the cosine "
                                "schedule's floor)")
    warnings += distillation.unused_settings(config, given, tables)
    if config.trainer.resume_mode != "resume_path":
        for key in given("trainer.resume_from_path"):
            warnings.append(f"{key} has no effect unless trainer.resume_mode = 'resume_path'")
    if not config.data.val_files:
        for key in given("trainer.log_val_generations") + given("trainer.validation_data_dir"):
            warnings.append(f"{key} has no effect without validation data (data.val_files)")
    return warnings


def _lora(config: JobConfig, manager) -> list[str]:
    """LoRA needs a backend that declares ``supports_lora``; its exclusion is a regular expression."""
    problems = []
    for key, pattern in (("model.lora_exclude_modules", config.model.lora_exclude_modules),
                         ("critic.model.lora_exclude_modules", config.critic.model.lora_exclude_modules)):
        try:
            re.compile(pattern or "")
        except re.error as exc:
            problems.append(f"{key} = {pattern!r}: expected a regular expression ({exc})")
    return problems + _lora_backend(config, manager) + _override_config_backend(config, manager)


def _override_config_backend(config: JobConfig, manager) -> list[str]:
    """model.override_config needs a backend that declares it applies it; otherwise the actor would
    train the folder's config while the inference engine ran the overridden one."""
    if not config.model.override_config:
        return []
    return backend_lacks(config, manager, "applies_model_override_config", "model.override_config",
                          "set config values over the model's", "edit the model folder's config.json")


def _lora_backend(config: JobConfig, manager) -> list[str]:
    ranks = [(key, rank) for key, rank in (("model.lora_rank", config.model.lora_rank),
                                           ("critic.model.lora_rank", config.critic.model.lora_rank)) if rank]
    if config.model.lora_adapter_path:
        ranks.append(("model.lora_adapter_path", config.model.lora_adapter_path))
    return [problem for key, value in ranks
            for problem in backend_lacks(config, manager, "supports_lora", f"{key} = {value!r}",
                                          "train LoRA adapters", f"leave {key} unset")]


def _sequence_parallel(config: JobConfig, manager) -> list[str]:
    """Ulysses sequence parallelism: a backend that declares ``supports_sequence_parallel``, packed
    rows, whole groups of workers."""
    trainer = config.trainer
    sizes = {"actor.ulysses_sequence_parallel_size": config.actor.ulysses_sequence_parallel_size,
             "ref.ulysses_sequence_parallel_size": config.ref.ulysses_sequence_parallel_size,
             "critic.ulysses_sequence_parallel_size": config.critic.ulysses_sequence_parallel_size}
    sizes = {key: size for key, size in sizes.items() if size not in (None, 1)}
    if not sizes:
        return []
    errors = [problem for key, size in sizes.items()
              for problem in backend_lacks(config, manager, "supports_sequence_parallel", f"{key} = {size}",
                                            "split sequences (Ulysses sequence parallelism)", f"set {key} = 1")]
    for key, size in sizes.items():
        workers = (config.critic.n_gpus_per_node if key.startswith("critic") and config.critic.n_gpus_per_node
                   else trainer.n_gpus_per_node) * trainer.nnodes
        if not config.model.use_remove_padding:
            errors.append(f"{key} = {size} splits packed rows: set model.use_remove_padding = true "
                          "(verl: actor_rollout_ref.model.use_remove_padding=True)")
        if workers % size:
            errors.append(f"{key} = {size} must divide the {workers} training workers into whole groups")
    return errors


def _top_k_distillation(config: JobConfig, manager) -> list[str]:
    """The top-k forward KL of an enabled distillation needs a backend that computes it."""
    if not config.distillation.enable or config.distillation.loss != distillation.TOP_K_LOSS:
        return []
    return backend_lacks(config, manager, "supports_top_k_distillation",
                         f"distillation.loss = {distillation.TOP_K_LOSS!r}",
                         "give the teacher's top-k tokens and the student's log-probs at them",
                         "a per-token estimator (distillation.loss = 'k1', 'k3', ...)")


def _router_replay(config: JobConfig, manager) -> list[str]:
    """actor.router_replay: a backend that replays routing; R2 records in the old log-prob pass (which
    bypass mode skips); R3 takes the engine's choices, so the engine must return them."""
    mode, rollout = config.actor.router_replay, config.rollout
    problems = []
    if rollout.return_routed_experts:
        if rollout.name in manager.registry("rollout_engines") and not engine_declares(
                manager, rollout.name, "returns_routed_experts"):
            able = engines_declaring(manager, "returns_routed_experts")
            problems.append(f"rollout.return_routed_experts: the {rollout.name!r} rollout engine does not return the "
                            f"experts it chose; use rollout.name = one of {', '.join(map(repr, able)) or '(none installed)'}")
        if "rollout.multi_turn" in config.sections and config.section("rollout.multi_turn").enable:
            # each turn is a generate call of its own, and the multi-turn driver rebuilds the rows from tokens
            problems.append("rollout.return_routed_experts: multi-turn rollouts (rollout.multi_turn.enable) do not "
                            "assemble the engine's routed experts across turns yet; turn one of them off (with "
                            "actor.router_replay = 'R2' the actor records its own routing instead)")
    if mode == "off":
        return problems
    problems += backend_lacks(config, manager, "replays_routing", f"actor.router_replay = {mode!r}",
                               "replay a mixture of experts' routing", "set actor.router_replay = 'off'")
    if mode == "R2" and config.algorithm.rollout_bypass:
        problems.append("actor.router_replay = 'R2' replays the choices of the old log-prob pass, which bypass mode "
                        "(algorithm.rollout_bypass) skips: use 'R3' (the engine's choices) or leave bypass off")
    if mode == "R3" and not rollout.return_routed_experts:
        problems.append("actor.router_replay = 'R3' replays the rollout engine's choices: set "
                        "rollout.return_routed_experts = true (verl: "
                        "actor_rollout_ref.rollout.enable_rollout_routing_replay=True)")
    return problems


def _validation(config: JobConfig) -> list[str]:
    if config.trainer.val_only and not config.data.val_files:
        return ["trainer.val_only validates and stops, but there is no validation data: set data.val_files"]
    return []


def _in_process(config: JobConfig) -> list[str]:
    """``trainer.ray = false`` runs exactly one worker, in the driver's process."""
    trainer, problems = config.trainer, []
    if trainer.ray:
        return problems
    if trainer.nnodes != 1 or trainer.n_gpus_per_node != 1:
        problems.append(f"trainer.ray = false runs one worker in this process, but trainer.nnodes = "
                        f"{trainer.nnodes} and trainer.n_gpus_per_node = {trainer.n_gpus_per_node} ask for "
                        f"{trainer.nnodes * trainer.n_gpus_per_node}: set both to 1, or trainer.ray = true")
    if config.critic.n_gpus_per_node > 0:
        problems.append("trainer.ray = false runs one worker in this process: a critic pool of its own "
                        f"(critic.n_gpus_per_node = {config.critic.n_gpus_per_node}) needs Ray; set it to 0 "
                        "(the critic shares the worker) or trainer.ray = true")
    if trainer.ray_address:
        problems.append(f"trainer.ray = false runs no Ray, but trainer.ray_address = {trainer.ray_address!r} "
                        "names a cluster: remove one of them")
    return problems


def _checkpoint_contents(config: JobConfig) -> list[str]:
    """A role's checkpoint holds parts rlcore knows, and its weights: a resume starts from them."""
    from rlcore.config.schema import CHECKPOINT_PARTS

    problems = []
    for role in ("actor", "critic"):
        contents = getattr(config, role).checkpoint.save_contents
        unknown = [part for part in contents if part not in CHECKPOINT_PARTS]
        if unknown:
            problems.append(f"{role}.checkpoint.save_contents: unknown part(s) {unknown}; expected some of "
                            f"{list(CHECKPOINT_PARTS)}")
        elif "model" not in contents:
            problems.append(f"{role}.checkpoint.save_contents = {list(contents)} has no 'model': an rlcore checkpoint "
                            "is what a run resumes from, and it cannot resume without the weights (for a Hugging "
                            "Face folder, `rlcore export` a checkpoint)")
    return problems


def check_job(config: JobConfig, set_keys: frozenset[str], manager) -> tuple[list[str], list[str]]:
    """(errors, warnings) for a structurally valid config."""
    from rlcore.asynchronous.config import async_problems

    errors = (_names(config, manager) + _batch_sizes(config, manager) + _algorithm(config, manager)
              + _validation(config) + distillation.problems(config) + _top_k_distillation(config, manager)
              + _lora(config, manager)
              + _sequence_parallel(config, manager) + _router_replay(config, manager) + _checkpoint_contents(config)
              + _in_process(config) + async_problems(config, set_keys, manager))
    return errors, _ineffective(config, set_keys, manager)
