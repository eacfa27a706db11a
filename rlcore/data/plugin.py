"""The built-in data preprocessors and the ``rlcore data`` command, registered like any plugin's."""

from rlcore import hookimpl


@hookimpl
def rlcore_register_data_preprocessors(register):
    from rlcore.data import arithmetic, geo3k, gsm8k, humaneval, shapes

    register("gsm8k", gsm8k.COMMAND)
    register("arithmetic", arithmetic.COMMAND)
    register("humaneval", humaneval.COMMAND)
    register("geo3k", geo3k.COMMAND)
    register("shapes", shapes.COMMAND)


@hookimpl
def rlcore_register_cli_commands(register):
    from rlcore.data import command

    register("data", command.COMMAND)
