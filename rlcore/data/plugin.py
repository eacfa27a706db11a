"""The built-in data preprocessors and the ``rlcore data`` command, registered like any plugin's."""

from rlcore import hookimpl
from rlcore.data import arithmetic, command, geo3k, gsm8k, humaneval, shapes


@hookimpl
def rlcore_register_data_preprocessors(register):
    register("gsm8k", gsm8k.COMMAND)
    register("arithmetic", arithmetic.COMMAND)
    register("humaneval", humaneval.COMMAND)
    register("geo3k", geo3k.COMMAND)
    register("shapes", shapes.COMMAND)


@hookimpl
def rlcore_register_cli_commands(register):
    register("data", command.COMMAND)
