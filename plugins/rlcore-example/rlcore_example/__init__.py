"""An rlcore plugin written as any third party would: hook implementations in a module.

Install it (``pip install plugins/rlcore-example``) and ``rlcore plugins`` lists it; a job uses its
names exactly like built-in ones.
"""

from rlcore.api import hookimpl

from rlcore_example.advantages import MEDIAN_BASELINE
from rlcore_example.agents import CALCULATOR_AGENT
from rlcore_example.rewards import compute_length_score
from rlcore_example.tools import WORD_COUNT


@hookimpl
def rlcore_register_reward_functions(register):
    register("example/target_length", compute_length_score)


@hookimpl
def rlcore_register_advantage_estimators(register):
    register("example/median_baseline", MEDIAN_BASELINE)


@hookimpl
def rlcore_register_tools(register):
    register(WORD_COUNT.name, WORD_COUNT)


@hookimpl
def rlcore_register_agents(register):
    register("example/calculator", CALCULATOR_AGENT)
