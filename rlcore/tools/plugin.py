"""The core's tools and its ``[rollout.multi_turn]`` table, registered as any plugin would."""

from rlcore import hookimpl


@hookimpl
def rlcore_register_tools(register):
    from rlcore.tools.calculator import CALCULATOR
    from rlcore.tools.python import PYTHON

    register(CALCULATOR.name, CALCULATOR)
    register(PYTHON.name, PYTHON)


@hookimpl
def rlcore_register_config_sections(register):
    from rlcore.rollout.multi_turn_config import MultiTurnConfig

    register("rollout.multi_turn", MultiTurnConfig)
