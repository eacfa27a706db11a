"""``[reward]``: how responses are scored (rule functions by data source, a user function, a reward
model), with the checks of the table's own settings. ``rlcore.config`` assembles it into ``JobConfig``."""

from __future__ import annotations

import attrs

from rlcore.plugins.settings import VerlKeys, setting


@attrs.frozen
class CustomRewardFunction:
    path: str | None = setting(None, doc="Python file with a verl-style compute_score")
    name: str = setting("compute_score", doc="function name in that file")
    batch: bool = setting(False, doc="call it once per batch with lists (data_sources, solution_strs, ground_truths, "
                                     "extra_infos) and take a list of scores back: verl's batch reward manager; "
                                     "reward.timeout_s is then the whole batch's limit")


@attrs.frozen
class OverlongBuffer:
    enable: bool = setting(False, doc="DAPO overlong reward shaping")
    len: int = setting(0, ge=0, doc="buffer length in tokens before max_response_length")
    penalty_factor: float = setting(1.0, ge=0.0)


@attrs.frozen
class RewardModelConfig:
    enable: bool = setting(False, doc="score responses with a reward model instead of reward functions")
    path: str | None = setting(None, doc="a sequence-classification model with one label (Hugging Face folder)")
    input_tokenizer: str | None = setting(None, doc="tokenizer whose chat template formats the conversation "
                                                    "(default: the reward model's own)")
    micro_batch_size_per_gpu: int | None = setting(None, ge=1, doc="rows per forward pass (default: all)")
    max_length: int | None = setting(None, ge=1, doc="truncate conversations to this many tokens (default: no)")
    trust_remote_code: bool = setting(False)


@attrs.frozen
class RewardConfig:
    custom_reward_function: CustomRewardFunction = setting(factory=CustomRewardFunction)
    model: RewardModelConfig = setting(factory=RewardModelConfig, doc="verl's reward_model.*")
    kind: str | None = setting(None, doc="registered reward that scores the responses; unset: 'model' with "
                                         "reward.model.enable, else the default ('function': the reward "
                                         "functions by data source)")
    format_score: float = setting(0.0, doc="score for a well-formed but wrong answer (gsm8k)")
    on_error: str = setting("raise", choices=("raise", "zero"),
                            doc="a reward function that fails: stop, or score 0 and count it")
    num_workers: int = setting(2, ge=0, doc="worker processes that run reward functions (0: in the driver, "
                                            "without timeouts; for a debugger)")
    timeout_s: float = setting(60.0, gt=0.0, doc="seconds one reward call may take before its worker is "
                                                "replaced and the sample counts as failed (reward.on_error)")
    batch_timeout_s: float = setting(0.0, ge=0.0, doc="seconds all reward calls of one batch may take "
                                                      "(0: no limit beyond timeout_s per call)")
    max_failed_share: float = setting(0.5, ge=0.0, le=1.0,
                                      doc="with on_error = 'zero': the job stops when more than this share of "
                                          "a batch's reward calls fail or time out (1: never)")
    overlong_buffer: OverlongBuffer = setting(factory=OverlongBuffer)


# --- the job's checks of [reward] (registered by rlcore.rewards.plugin) -----------------------------


def problems(job) -> list[str]:
    """Errors of the [reward] table, each naming its key."""
    reward, errors = job.config.reward, []
    if reward.model.enable and not reward.model.path:
        errors.append("reward.model.enable: a reward model needs reward.model.path (verl: reward_model.model.path)")
    if reward.overlong_buffer.enable and reward.overlong_buffer.len >= job.config.data.max_response_length:
        errors.append(f"reward.overlong_buffer.len ({reward.overlong_buffer.len}) must be smaller than "
                      f"data.max_response_length ({job.config.data.max_response_length})")
    return errors


def unused(job) -> list[str]:
    """Warnings for [reward] settings given that nothing reads."""
    warnings, given = [], job.given
    if job.config.reward.custom_reward_function.path is None:
        for key in given("reward.custom_reward_function.batch"):
            warnings.append(f"{key} has no effect without reward.custom_reward_function.path (the built-in "
                            "rewards are called once per sample)")
        for key in given("reward.custom_reward_function.name"):
            warnings.append(f"{key} has no effect without reward.custom_reward_function.path (the file that "
                            "defines the function); the built-in rewards score by data_source")
    return warnings


# verl's keys of the table: today's reward model keys (verl >= 0.6.1), then the older reward_model.* (the
# rules for verl's reward-model server, which rlcore has not, are the core's: rlcore.config.verl_keys)
VERL_KEYS = VerlKeys(aliases=(
    ("reward.reward_model.enable", "reward.model.enable"),
    ("reward.reward_model.model_path", "reward.model.path"),
    ("custom_reward_function.", "reward.custom_reward_function."),
    ("reward_model.overlong_buffer.", "reward.overlong_buffer."),
    ("reward.reward_kwargs.overlong_buffer_cfg.", "reward.overlong_buffer."),  # verl's DAPO reward manager's
    ("reward_model.reward_kwargs.overlong_buffer_cfg.", "reward.overlong_buffer."),
    ("reward_model.model.", "reward.model."),
    ("reward_model.", "reward.model."),
))
