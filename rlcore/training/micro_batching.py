"""How each pass of a training backend cuts its rows into micro-batches, from the job's settings:
a fixed number of rows, or (dynamic batch size) a token budget per micro-batch. A pass's own setting
wins where it is set; else the actor's applies (verl's defaults). The driver puts each pass's plan in its
role's spec (``rlcore.training.specs``); a backend reads it there."""

from __future__ import annotations

import attrs

# JobConfig (rlcore.config.schema) is named in hints, never imported: the driver makes the role specs
# (rlcore.training.specs) from the job with these plans, and the configuration stands above both.


@attrs.frozen
class MicroBatchPlan:
    rows: int | None  # rows per micro-batch; None: by token budget
    token_budget: int | None  # tokens per micro-batch; None: by rows
    budget_name: str  # the setting a row over the budget is reported against


def _pick(value, default):
    return default if value is None else value


def forward_plan(micro_rows: int | None, dynamic: bool, budget: int, budget_name: str) -> MicroBatchPlan:
    """A forward-only pass: the fixed row count when one is set and dynamic batch size is off, else
    micro-batches within the token budget."""
    if micro_rows is not None and not dynamic:
        return MicroBatchPlan(micro_rows, None, budget_name)
    return MicroBatchPlan(None, budget, budget_name)


def _log_prob_plan(config: JobConfig, section: str) -> MicroBatchPlan:
    """A log-prob pass (``rollout``: the old log-probs, ``ref``: the reference's) from its section's
    ``log_prob_*`` settings, the actor's where unset."""
    own, actor = getattr(config, section), config.actor
    return forward_plan(own.log_prob_micro_batch_size_per_gpu,
                        _pick(own.log_prob_use_dynamic_bsz, actor.use_dynamic_bsz),
                        _pick(own.log_prob_max_token_len_per_gpu, actor.ppo_max_token_len_per_gpu),
                        f"{section}.log_prob_max_token_len_per_gpu")


def old_log_prob_plan(config: JobConfig) -> MicroBatchPlan:
    return _log_prob_plan(config, "rollout")


def ref_log_prob_plan(config: JobConfig) -> MicroBatchPlan:
    return _log_prob_plan(config, "ref")


def actor_update_plan(config: JobConfig) -> MicroBatchPlan:
    actor = config.actor
    return MicroBatchPlan(actor.ppo_micro_batch_size_per_gpu,
                          actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None,
                          "actor.ppo_max_token_len_per_gpu")


def _critic_dynamic(config: JobConfig) -> tuple[bool, int]:
    critic, actor = config.critic, config.actor
    return (_pick(critic.use_dynamic_bsz, actor.use_dynamic_bsz),
            critic.ppo_max_token_len_per_gpu or actor.ppo_max_token_len_per_gpu)


def critic_values_plan(config: JobConfig) -> MicroBatchPlan:
    dynamic, update_budget = _critic_dynamic(config)
    return forward_plan(config.critic.ppo_micro_batch_size_per_gpu, dynamic,
                        config.critic.forward_max_token_len_per_gpu or update_budget,
                        "critic.forward_max_token_len_per_gpu")


def critic_update_plan(config: JobConfig) -> MicroBatchPlan:
    dynamic, budget = _critic_dynamic(config)
    return MicroBatchPlan(config.critic.ppo_micro_batch_size_per_gpu, budget if dynamic else None,
                          "critic.ppo_max_token_len_per_gpu")
