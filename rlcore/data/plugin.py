"""The built-in data preprocessors and the ``rlcore data`` command, registered like any plugin's."""

from rlcore import hookimpl
from rlcore.data import arithmetic, command, gsm8k, humaneval


@hookimpl
def rlcore_register_data_preprocessors(register):
    register("gsm8k", gsm8k.COMMAND)
    register("arithmetic", arithmetic.COMMAND)
    register("humaneval", humaneval.COMMAND)


@hookimpl
def rlcore_register_cli_commands(register):
    register("data", command.COMMAND)
