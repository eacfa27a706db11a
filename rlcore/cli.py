"""The ``rlcore`` command. Subcommands are plugins' ``rlcore_register_cli_commands`` registrations.

User errors (``RlcoreError``) print as one message without a traceback and exit with status 2;
``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import attrs

import rlcore
from rlcore.errors import RlcoreError, describe_exit
from rlcore.plugins.manager import get_manager
from rlcore.runtime.stopping import Stopped

USAGE_ERROR = 2


@attrs.frozen
class Command:
    """One subcommand: its help line, how to add its arguments, and what it runs."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]


def _parser(commands: dict[str, Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlcore", description="RL post-training of LLMs, as plugins.")
    parser.add_argument("--version", action="version", version=f"rlcore {rlcore.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in sorted(commands.items()):
        command.configure(sub.add_parser(name, help=command.help, description=command.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        registry = get_manager().registry("cli_commands")
        parser = _parser({name: registry.get(name) for name in registry})
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return USAGE_ERROR
        command = registry.get(args.command)
        try:
            return command.run(args) or 0
        except SystemExit as exc:
            # Commands return their status; a SystemExit inside one comes from code it ran (a reward
            # function, a plugin, a library). Passing its status on would let sys.exit(0) record a
            # job that never trained as a success.
            if debug:
                raise
            print(f"rlcore: error: code run by `rlcore {args.command}` {describe_exit(exc)}; "
                  "the command did not finish", file=sys.stderr)
            return USAGE_ERROR
    except RlcoreError as exc:
        if debug:
            raise
        print(f"rlcore: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt as exc:  # Ctrl-C, or a stop signal (rlcore.runtime.stopping)
        print("rlcore: interrupted" if not isinstance(exc, Stopped) else f"rlcore: stopped by {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)


def entry_point() -> None:
    sys.exit(main())
