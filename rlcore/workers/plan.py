"""Which roles a job needs, and why: the reference only with a KL term or as the distillation teacher, the
critic only if asked for."""

from __future__ import annotations

import attrs

from rlcore.algorithms.rollout_correction import needs_whole_batch
from rlcore.config.schema import JobConfig
from rlcore.training.backends import ActorAlgorithms, resolve_actor_algorithms, training_backend
from rlcore.training.specs import RoleSpecs, role_specs, training_spec


@attrs.frozen
class RolePlan:
    reference: bool
    critic: bool
    reasons: tuple[str, ...]
    specs: RoleSpecs  # what each role's builder receives, computed here, in the driver
    reward_model: bool = False
    old_log_prob_pass: bool = True  # a separate old log-prob pass before the update (else the update's own)

    @property
    def actor_algorithms(self) -> ActorAlgorithms:
        """The actor's loss objects, resolved here and handed to the backend in the actor's spec."""
        return self.specs.actor.algorithms

    def describe(self) -> str:
        return "\n".join(self.reasons)


def plan_roles(config: JobConfig, manager, total_steps: int | None = None) -> RolePlan:
    """The roles of the job and their specs (``total_steps``: the run's training steps, for the
    learning-rate schedules)."""
    estimator = manager.get("advantage_estimators", config.algorithm.adv_estimator)
    kl_terms = [name for name, on in (("actor.use_kl_loss", config.actor.use_kl_loss),
                                      ("algorithm.use_kl_in_reward", config.algorithm.use_kl_in_reward)) if on]
    needs_critic = estimator.needs_critic
    workers = config.trainer.n_gpus_per_node * config.trainer.nnodes
    layout = training_backend(manager, config.trainer.backend).describe_layout(training_spec(config, "actor"), workers)
    reasons = [
        f"actor: {config.trainer.backend} backend, model {config.model.path}, {workers} worker(s)"
        + (f", {layout}" if layout else "")
        + (f", LoRA rank {config.model.lora_rank} (alpha {config.model.lora_alpha:g}) on "
           f"{', '.join(config.model.target_modules)}" if config.model.lora_rank else ""),
        f"rollout: {config.rollout.name} engine, colocated with the actor, n = {config.rollout.n}",
        _reference_reason(config, kl_terms),
        f"critic: on, algorithm.adv_estimator = {config.algorithm.adv_estimator!r} needs values"
        + (f"; LoRA rank {config.critic.model.lora_rank} on {', '.join(config.critic.model.target_modules)} "
           "and the whole value head" if config.critic.model.lora_rank else "") if needs_critic
        else f"critic: off (algorithm.adv_estimator = {config.algorithm.adv_estimator!r} needs no critic)",
    ]
    reward_model = config.reward.model.enable
    reasons.append(f"reward model: on, {config.reward.model.path} scores the responses (reward.model.enable)"
                   if reward_model else "reward model: off (reward functions score the responses)")
    old_pass, why = old_log_prob_pass(config)
    reasons.append(f"old log-probs: {why}")
    algorithms = resolve_actor_algorithms(config, manager, old_log_probs_in_update=not old_pass)
    return RolePlan(reference=bool(kl_terms) or config.distillation.enable, critic=needs_critic, reasons=tuple(reasons),
                    specs=role_specs(config, algorithms, total_steps),
                    reward_model=reward_model,
                    old_log_prob_pass=old_pass)


def _reference_reason(config: JobConfig, kl_terms: list[str]) -> str:
    if config.distillation.enable:
        settings = config.distillation
        teachers = ", ".join([f"{path} for {source}" for source, path in settings.teachers.items()]
                             + ([f"{settings.teacher_path} for the rest"] if settings.teachers and settings.teacher_path
                                else []))
        return (f"reference: the distillation teacher{'s ' + teachers if settings.teachers else ' ' + settings.teacher_path} "
                "(distillation.enable), "
                f"{settings.loss} estimate of KL(student || teacher) per token"
                + (" as a policy-gradient advantage" if settings.use_policy_gradient else " as a loss")
                + (f", times {settings.coef:g} beside the task's loss" if settings.use_task_rewards
                   else ", in place of the task's loss"))
    if kl_terms:
        return ("reference: on, for " + " and ".join(kl_terms)
                + (" (the actor's base model: its LoRA adapters off)" if config.model.lora_rank else ""))
    return "reference: off (no KL term: actor.use_kl_loss and algorithm.use_kl_in_reward are false)"


def old_log_prob_pass(config: JobConfig) -> tuple[bool, str]:
    """Whether the step needs a separate pass for the old log-probs, and why. Without one, the
    update's own forward pass gives them: when every sample trains exactly once, before the only
    optimizer step of the step, the policy that scores it is still the one that generated it."""
    actor, algorithm = config.actor, config.algorithm
    whole_batch = needs_whole_batch(algorithm)
    if algorithm.rollout_bypass:
        return False, "the rollout engine's own (algorithm.rollout_bypass): the PPO ratio is pi_theta / pi_rollout"
    needs = [why for why, on in (
        ("actor.reuse_on_policy_log_probs is false", not actor.reuse_on_policy_log_probs),
        (f"actor.ppo_epochs = {actor.ppo_epochs}", actor.ppo_epochs > 1),
        (f"actor.ppo_mini_batch_size = {actor.ppo_mini_batch_size} < data.train_batch_size = "
         f"{config.data.train_batch_size}", actor.ppo_mini_batch_size < config.data.train_batch_size),
        (f"algorithm.rollout_is_threshold: {whole_batch}", algorithm.rollout_is_threshold is not None and whole_batch),
        ("algorithm.use_kl_in_reward", algorithm.use_kl_in_reward),
        ("actor.calculate_sum_pi_squared: the pass computes it", actor.calculate_sum_pi_squared),
        ("actor.router_replay = 'R2' replays the routing the pass records", actor.router_replay == "R2"),
    ) if on]
    if needs:
        return True, "a separate pass (" + "; ".join(needs) + ")"
    return False, ("from the update's own forward pass (on-policy: one epoch, one mini-batch per step)"
                   + ("; the rollout correction (algorithm.rollout_is_threshold) weighs each micro-batch against them"
                      if algorithm.rollout_is_threshold is not None else ""))
