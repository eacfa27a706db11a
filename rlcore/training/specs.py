"""Role specs: what a training backend's or a rollout engine's builder receives, computed by the driver.

A builder never sees the whole job (``JobConfig``): the driver resolves what the role reads (its own
table, the model and optimizer settings, samples per mini-batch, the micro-batch plans, the run's total
steps, the resolved loss objects, the plugin tables) into one frozen record, and the builder takes that.
Each field has one owner here; a setting that falls back to another's (the critic's mini-batch size to
the actor's, the reference's sequence-parallel size to the actor's) arrives resolved.

The records hold the components' own tables (``ModelConfig``, ``ActorConfig``, ``RolloutConfig``, ...)
where a role reads many of their settings; the functions below them (``actor_spec``, ...) are the
driver's and the only code that reads the job to make them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from rlcore.algorithms.distillation import reference_model_overrides, reference_model_path, teacher_top_k
from rlcore.batch import mini_batch_rows
from rlcore.training.micro_batching import (
    MicroBatchPlan,
    actor_update_plan,
    critic_update_plan,
    critic_values_plan,
    old_log_prob_plan,
    ref_log_prob_plan,
)

# ModelConfig, ActorConfig, CriticConfig, OptimConfig, RolloutConfig, DistillationConfig and JobConfig
# are named in hints, never imported: the configuration assembles the components' tables, so it stands
# above them (tests/core/test_config_stands_above.py).

@attrs.frozen
class ActorAlgorithms:
    """The algorithm objects an actor trains with, resolved from the registries by the driver
    (the backend never looks them up itself)."""

    policy_loss: Any  # a registered policy loss (actor.policy_loss): see rlcore.algorithms.policy_losses
    kl_estimator: Any | None  # the registered KL estimator of actor.kl_loss_type; None: no KL loss
    # distillation.enable: rlcore.algorithms.distillation.Distillation (micro_batch_actor_loss reads it here)
    distillation: Any | None = None
    # the job's AlgorithmConfig where the update's own forward pass gives the old log-probs and rollout
    # correction is on: micro_batch_actor_loss weighs each micro-batch (rollout_correction.weigh_micro_batch)
    rollout_correction: Any | None = None


@attrs.frozen(kw_only=True)
class TrainingSpec:
    """What every role of a training backend reads; also what ``TrainingBackend.data_parallel_ranks`` and
    ``describe_layout`` are asked with."""

    role: str  # "actor", "reference" or "critic"
    model: ModelConfig  # [model], the policy's: dtype, trust_remote_code, use_remove_padding, tokenizer, LoRA
    path: str  # the weights this role loads: model.path; the reference: the distillation teacher's; the critic:
    # critic.model.path, else model.path
    seed: int  # trainer.seed
    # the job's plugin tables by dotted path ("actor.<backend>", "ref.<backend>", ...): a backend reads its own
    sections: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)

    def section(self, path: str, default: Any = None) -> Any:
        """The plugin table ``path``; ``default`` where the job has none (a job built in code, not loaded)."""
        return self.sections.get(path, default)


@attrs.frozen(kw_only=True)
class TrainedSpec(TrainingSpec):
    """What a role that trains (the actor, the critic) reads besides: its optimizer and update loop."""

    optim: OptimConfig  # <role>.optim: AdamW settings and the learning-rate schedule
    total_steps: int | None  # training steps of the run, for the schedule (None: told by set_total_steps)
    mini_batch_prompts: int  # prompts per optimizer step (the critic's: critic.ppo_mini_batch_size, else the actor's)
    samples_per_prompt: int  # rollout.n
    epochs: int  # passes over each step's batch (the critic's: critic.ppo_epochs, else the actor's)
    shuffle: bool  # a fresh row order each epoch (actor.shuffle, for both)
    update_plan: MicroBatchPlan  # how the update cuts a mini-batch into micro-batches
    loss_agg_mode: str  # how per-token losses reduce to one (<role>.loss_agg_mode)
    norm_length: int  # data.max_response_length: seq-mean-token-sum-norm's constant length
    checkpoint_contents: tuple[str, ...]  # <role>.checkpoint.save_contents

    def mini_batch_rows(self, groups: int) -> int:
        """Rows of one mini-batch for each of ``groups`` data-parallel groups: samples per mini-batch
        (prompts x n) split evenly over them (``rlcore.api.mini_batch_rows``)."""
        return mini_batch_rows(self.mini_batch_prompts, self.samples_per_prompt, groups, self.role)


@attrs.frozen(kw_only=True)
class ActorSpec(TrainedSpec):
    """What a backend's actor builder receives."""

    actor: ActorConfig  # [actor]: what the policy loss reads (clip ratios, entropy_coeff, kl_loss_coef, ...),
    # router_replay, use_torch_compile, calculate_sum_pi_squared, ulysses_sequence_parallel_size, use_kl_loss
    algorithms: ActorAlgorithms  # the policy loss, KL estimator and distillation objects, resolved from the registries
    distillation: DistillationConfig | None  # [distillation] when distillation.enable, else None
    temperature: float  # rollout.temperature: the log-probs are the sampling distribution's
    log_prob_plan: MicroBatchPlan  # the old log-prob pass's micro-batches
    reference_plan: MicroBatchPlan  # the reference's log-prob pass, where the actor serves it (reference_view)


@attrs.frozen(kw_only=True)
class ReferenceSpec(TrainingSpec):
    """What a backend's reference builder receives (the initial policy, or a distillation teacher)."""

    override_config: Mapping[str, Any]  # config values set over the model's (model.override_config; none for a teacher)
    sequence_parallel_size: int | None  # ref.ulysses_sequence_parallel_size, else the actor's
    use_torch_compile: bool  # actor.use_torch_compile (verl's reference follows the actor's)
    temperature: float  # rollout.temperature
    log_prob_plan: MicroBatchPlan  # the reference's log-prob pass
    top_k: int  # distillation.topk under the top-k loss: the teacher's top tokens per position; else 0


@attrs.frozen(kw_only=True)
class CriticSpec(TrainedSpec):
    """What a backend's critic builder receives."""

    critic: CriticConfig  # [critic]: its model (LoRA, gradient checkpointing), cliprange_value,
    # ulysses_sequence_parallel_size
    values_plan: MicroBatchPlan  # the value pass's micro-batches


@attrs.frozen(kw_only=True)
class RolloutSpec:
    """What a rollout engine's builder receives."""

    rollout: RolloutConfig  # [rollout]: parallel sizes, memory, sampling defaults, what the rows carry
    model: ModelConfig  # [model]: the policy the engine serves (path, tokenizer, dtype, overrides, LoRA)
    seed: int  # trainer.seed
    context_length: int  # data.max_prompt_length + data.max_response_length: the longest sequence
    sections: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)  # plugin tables ("rollout.<engine>")

    def section(self, path: str, default: Any = None) -> Any:
        """The plugin table ``path``; ``default`` where the job has none."""
        return self.sections.get(path, default)


# --- the driver's side: specs from the job ------------------------------------------------------------


def training_spec(config: JobConfig, role: str) -> TrainingSpec:
    """The part of ``role``'s spec that says how it is laid out (``TrainingBackend.data_parallel_ranks``)."""
    paths = {"actor": config.model.path, "reference": reference_model_path(config),
             "critic": config.critic.model.path or config.model.path}
    return TrainingSpec(role=role, model=config.model, path=paths[role], seed=config.trainer.seed,
                        sections=config.sections)


def _trained(config: JobConfig, role: str, total_steps: int | None) -> dict[str, Any]:
    actor, own = config.actor, getattr(config, role)
    return dict(attrs.asdict(training_spec(config, role), recurse=False),
                optim=own.optim, total_steps=total_steps,
                mini_batch_prompts=own.ppo_mini_batch_size or actor.ppo_mini_batch_size,
                samples_per_prompt=config.rollout.n, epochs=own.ppo_epochs or actor.ppo_epochs,
                shuffle=actor.shuffle, loss_agg_mode=own.loss_agg_mode, norm_length=config.data.max_response_length,
                checkpoint_contents=own.checkpoint.save_contents)


def actor_spec(config: JobConfig, algorithms: ActorAlgorithms, total_steps: int | None = None) -> ActorSpec:
    """The actor's spec, training with ``algorithms`` (``rlcore.training.backends.resolve_actor_algorithms``)."""
    return ActorSpec(**_trained(config, "actor", total_steps), update_plan=actor_update_plan(config),
                     actor=config.actor, algorithms=algorithms,
                     distillation=config.distillation if config.distillation.enable else None,
                     temperature=config.rollout.temperature, log_prob_plan=old_log_prob_plan(config),
                     reference_plan=ref_log_prob_plan(config))


def reference_spec(config: JobConfig) -> ReferenceSpec:
    """The reference's spec: the initial policy, or under distillation the teacher (``teacher_spec`` for
    each of several)."""
    return ReferenceSpec(**attrs.asdict(training_spec(config, "reference"), recurse=False),
                         override_config=reference_model_overrides(config),
                         sequence_parallel_size=config.ref.ulysses_sequence_parallel_size
                         or config.actor.ulysses_sequence_parallel_size,
                         use_torch_compile=config.actor.use_torch_compile, temperature=config.rollout.temperature,
                         log_prob_plan=ref_log_prob_plan(config), top_k=teacher_top_k(config))


def teacher_spec(spec: ReferenceSpec, path: str) -> ReferenceSpec:
    """``spec`` for one teacher of ``distillation.teachers``: its own model, nothing set over it."""
    return attrs.evolve(spec, path=path, override_config={})


def critic_spec(config: JobConfig, total_steps: int | None = None) -> CriticSpec:
    """The critic's spec; its mini-batch size and epochs default to the actor's."""
    return CriticSpec(**_trained(config, "critic", total_steps), update_plan=critic_update_plan(config),
                      critic=config.critic, values_plan=critic_values_plan(config))


def rollout_spec(config: JobConfig) -> RolloutSpec:
    """The rollout engine's spec."""
    data = config.data
    return RolloutSpec(rollout=config.rollout, model=config.model, seed=config.trainer.seed,
                       context_length=data.max_prompt_length + data.max_response_length, sections=config.sections)


@attrs.frozen
class RoleSpecs:
    """Every role's spec of one job, handed to the workers with the role plan."""

    actor: ActorSpec
    reference: ReferenceSpec
    critic: CriticSpec
    rollout: RolloutSpec


def role_specs(config: JobConfig, algorithms: ActorAlgorithms, total_steps: int | None = None) -> RoleSpecs:
    """Every role's spec, the actor training with ``algorithms``, the schedules over ``total_steps``."""
    return RoleSpecs(actor_spec(config, algorithms, total_steps), reference_spec(config),
                     critic_spec(config, total_steps), rollout_spec(config))
