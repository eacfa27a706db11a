"""The core's tools and its ``[rollout.multi_turn]`` table, registered as any plugin would."""

from rlcore import hookimpl
from rlcore.tools.calculator import CALCULATOR
from rlcore.tools.config import MultiTurnConfig
from rlcore.tools.python import PYTHON


@hookimpl
def rlcore_register_tools(register):
    register(CALCULATOR.name, CALCULATOR)
    register(PYTHON.name, PYTHON)


@hookimpl
def rlcore_register_config_sections(register):
    register("rollout.multi_turn", MultiTurnConfig)
