"""The built-in rewards (by ``reward.kind``) and reward functions (by data_source), registered
through the same hooks a plugin uses."""

from rlcore import hookimpl
from rlcore.plugins.settings import JobCheck
from rlcore.rewards import arithmetic, code, config, geo3k, gsm8k, gsm8k_tools, math, shapes


@hookimpl
def rlcore_register_rewards(register):
    from rlcore.rewards.roles import FunctionReward, ModelReward  # torch: when the registry is asked

    register("function", FunctionReward, default=True)
    register("model", ModelReward)


@hookimpl
def rlcore_register_reward_functions(register):
    register(gsm8k.DATA_SOURCE, gsm8k.compute_score)
    register(gsm8k_tools.DATA_SOURCE, gsm8k_tools.compute_score)
    register(arithmetic.DATA_SOURCE, arithmetic.compute_score)
    register(geo3k.DATA_SOURCE, geo3k.compute_score)
    register(shapes.DATA_SOURCE, shapes.compute_score)
    for data_source in code.DATA_SOURCES:
        register(data_source, code.compute_score)
    for data_source in math.DATA_SOURCES:
        register(data_source, math.compute_score)


@hookimpl
def rlcore_register_job_checks(register):
    register("reward", JobCheck(problems=config.problems, unused=config.unused))


@hookimpl
def rlcore_register_verl_keys(register):
    register("reward", config.VERL_KEYS)
