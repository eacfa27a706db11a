"""``[rollout]``: the settings every rollout engine shares (an engine's own options are its plugin's
``[rollout.<engine>]`` section). ``rlcore.config`` assembles it into ``JobConfig``."""

from __future__ import annotations

import attrs

from rlcore.plugins.settings import VerlKeys, setting
from rlcore.rollout.declared import engine_declares, engines_declaring


@attrs.frozen
class ValidationSampling:
    n: int = setting(1, ge=1)
    do_sample: bool = setting(False, doc="false: greedy")
    temperature: float = setting(0.0, ge=0.0)
    top_p: float = setting(1.0, gt=0.0, le=1.0)
    top_k: int = setting(-1, ge=-1)


@attrs.frozen
class RolloutConfig:
    name: str | None = setting(None, doc="registered rollout engine; unset: the installed engine that declares "
                                         "itself the default")
    n: int = setting(1, ge=1, doc="responses per prompt")
    temperature: float = setting(1.0, ge=0.0)
    top_p: float = setting(1.0, gt=0.0, le=1.0)
    top_k: int = setting(-1, ge=-1, doc="-1: off")
    do_sample: bool = setting(True)
    log_prob_micro_batch_size_per_gpu: int | None = setting(None, ge=1)
    log_prob_use_dynamic_bsz: bool | None = setting(
        None, doc="old log-probs in token-budget micro-batches; None: actor.use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int | None = setting(
        None, ge=1, doc="token budget of an old log-prob micro-batch; None: actor.ppo_max_token_len_per_gpu")
    tensor_model_parallel_size: int = setting(1, ge=1)
    data_parallel_size: int = setting(
        1, ge=1, doc="ranks of one inference engine that each serve prompts of their own, tensor_model_parallel_size "
                     "devices each (attention data-parallel for mixture-of-experts models), for an engine that "
                     "supports it (docs/engines.md); the engine may ask that tensor_model_parallel_size x "
                     "data_parallel_size equal the workers")
    expert_parallel_size: int = setting(
        1, ge=1, doc="1, or tensor_model_parallel_size x data_parallel_size: a mixture-of-experts model's experts "
                     "split over the engine's ranks instead of sharded by tensor parallelism, for an engine that "
                     "supports it")
    quantization: str | None = setting(
        None, doc="the inference engine's weight quantization method, e.g. 'fp8' (the engine's own name for it): "
                  "the engine quantizes the weights it loads and each weight sync; the actor trains at "
                  "model.dtype. None: the engine runs at model.dtype")
    gpu_memory_utilization: float = setting(0.5, gt=0.0, le=1.0)
    free_cache_engine: bool = setting(True, doc="release engine memory while training")
    calculate_log_probs: bool = setting(True, doc="keep the engine's rollout_log_probs (needed by "
                                                  "algorithm.rollout_is_threshold and bypass mode); false: the engine "
                                                  "is asked for none (an engine that cannot skip them has them "
                                                  "dropped). Left unset, rlcore train turns it off where nothing "
                                                  "reads them, and says so at start")
    return_routed_experts: bool = setting(
        False, doc="the engine returns the experts it chose for each token in each mixture-of-experts layer (batch "
                   "column routed_experts), for actor.router_replay = 'R3'; on an engine that does")
    val: ValidationSampling = setting(factory=ValidationSampling, doc="sampling for validation")


# --- the job's checks of [rollout] (registered by rlcore.rollout.plugin) ----------------------------


def problems(job) -> list[str]:
    """The engine's parallelism against the job's workers (verl's rule: the experts are split over all
    the engine's ranks, tensor x data parallel, or not at all), and what returning routed experts needs."""
    config, rollout, errors = job.config, job.config.rollout, []
    workers = config.trainer.n_gpus_per_node * config.trainer.nnodes
    tp, dp, ep = rollout.tensor_model_parallel_size, rollout.data_parallel_size, rollout.expert_parallel_size
    if tp > workers:
        errors.append(f"rollout.tensor_model_parallel_size ({tp}) cannot exceed the number of workers ({workers})")
    if tp * dp > workers:
        errors.append(f"rollout.tensor_model_parallel_size x data_parallel_size ({tp} x {dp}) cannot exceed the "
                      f"number of workers ({workers})")
    if ep not in (1, tp * dp):
        errors.append(f"rollout.expert_parallel_size ({ep}) must be 1 or tensor_model_parallel_size x "
                      f"data_parallel_size ({tp} x {dp} = {tp * dp}): the engine splits the experts over all its ranks")
    if rollout.return_routed_experts:
        if rollout.name in job.manager.registry("rollout_engines") and not engine_declares(
                job.manager, rollout.name, "returns_routed_experts"):
            able = engines_declaring(job.manager, "returns_routed_experts")
            errors.append(f"rollout.return_routed_experts: the {rollout.name!r} rollout engine does not return the "
                          f"experts it chose; use rollout.name = one of {', '.join(map(repr, able)) or '(none installed)'}")
        if "rollout.multi_turn" in config.sections and config.section("rollout.multi_turn").enable:
            # each turn is a generate call of its own, and the multi-turn driver rebuilds the rows from tokens
            errors.append("rollout.return_routed_experts: multi-turn rollouts (rollout.multi_turn.enable) do not "
                          "assemble the engine's routed experts across turns yet; turn one of them off (with "
                          "actor.router_replay = 'R2' the actor records its own routing instead)")
    return errors


# --- what the job's start resolves in [rollout] (called by rlcore train) -----------------------------


def unread_log_probs_off(job):
    """(the job, a line saying so) with ``rollout.calculate_log_probs`` turned off where the job leaves
    it at its default and nothing reads the engine's log-probs: no rollout correction
    (``algorithm.rollout_is_threshold``, which its mismatch metrics come with) and no bypass mode. An
    engine then skips them (an inference engine can spend a third of its generation time on them); (job, None)
    where they stay on."""
    config = job.config
    if ("rollout.calculate_log_probs" in job.set_keys or not config.rollout.calculate_log_probs
            or config.algorithm.rollout_is_threshold is not None or config.algorithm.rollout_bypass):
        return job, None
    rollout = attrs.evolve(config.rollout, calculate_log_probs=False)
    line = ("rollout: the engine computes no log-probs of its samples: nothing reads them (no rollout correction, "
            "algorithm.rollout_is_threshold, and no bypass mode); set rollout.calculate_log_probs = true to keep them")
    return attrs.evolve(job, config=attrs.evolve(config, rollout=rollout)), line


# verl's keys of the table, where they are spelled otherwise (the engines' own tables are their plugins')
VERL_KEYS = VerlKeys(aliases=(
    ("actor_rollout_ref.rollout.val_kwargs.", "rollout.val."),
    ("actor_rollout_ref.rollout.enable_rollout_routing_replay", "rollout.return_routed_experts"),
    ("actor_rollout_ref.rollout.", "rollout."),
))
