"""The micro-batch plan of each pass: its own setting where set, else the actor's (verl's defaults)."""

from __future__ import annotations

import attrs

from rlcore.config.schema import ActorConfig, CriticConfig, JobConfig, RefConfig, RolloutConfig
from rlcore.training.micro_batching import (
    MicroBatchPlan,
    actor_update_plan,
    critic_update_plan,
    critic_values_plan,
    old_log_prob_plan,
    ref_log_prob_plan,
)


def job(**sections) -> JobConfig:
    return attrs.evolve(JobConfig(), **sections)


def test_fixed_rows_unless_dynamic_batch_size_then_the_token_budget():
    config = job(actor=ActorConfig(ppo_micro_batch_size_per_gpu=4, ppo_max_token_len_per_gpu=100),
                 rollout=RolloutConfig(log_prob_micro_batch_size_per_gpu=8),
                 ref=RefConfig(log_prob_micro_batch_size_per_gpu=2))
    assert old_log_prob_plan(config) == MicroBatchPlan(8, None, "rollout.log_prob_max_token_len_per_gpu")
    assert ref_log_prob_plan(config) == MicroBatchPlan(2, None, "ref.log_prob_max_token_len_per_gpu")
    assert actor_update_plan(config) == MicroBatchPlan(4, None, "actor.ppo_max_token_len_per_gpu")
    dynamic = attrs.evolve(config, actor=attrs.evolve(config.actor, use_dynamic_bsz=True))
    assert old_log_prob_plan(dynamic) == MicroBatchPlan(None, 100, "rollout.log_prob_max_token_len_per_gpu")
    assert actor_update_plan(dynamic) == MicroBatchPlan(4, 100, "actor.ppo_max_token_len_per_gpu")


def test_a_pass_without_its_own_rows_goes_by_the_token_budget_and_its_own_settings_win():
    config = job(actor=ActorConfig(ppo_max_token_len_per_gpu=100),
                 rollout=RolloutConfig(log_prob_use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=50),
                 critic=CriticConfig(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=70))
    assert old_log_prob_plan(config) == MicroBatchPlan(None, 50, "rollout.log_prob_max_token_len_per_gpu")
    assert ref_log_prob_plan(config) == MicroBatchPlan(None, 100, "ref.log_prob_max_token_len_per_gpu")
    assert critic_update_plan(config) == MicroBatchPlan(None, 70, "critic.ppo_max_token_len_per_gpu")
    assert critic_values_plan(config) == MicroBatchPlan(None, 70, "critic.forward_max_token_len_per_gpu")
    forward = attrs.evolve(config, critic=attrs.evolve(config.critic, forward_max_token_len_per_gpu=90))
    assert critic_values_plan(forward).token_budget == 90
