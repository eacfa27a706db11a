"""``rlcore data NAME ...``: runs a registered data preprocessor (``rlcore_register_data_preprocessors``)."""

from __future__ import annotations

import argparse

from rlcore.cli import Command
from rlcore.plugins.manager import get_manager


def _preprocessors():
    return get_manager().registry("data_preprocessors")


def _configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_preprocessor", metavar="NAME", required=True)
    for name, entry in ((e.name, e.value) for e in _preprocessors().entries()):
        entry.configure(sub.add_parser(name, help=entry.help, description=entry.help))


def _run(args: argparse.Namespace) -> int:
    return _preprocessors().get(args.data_preprocessor).run(args) or 0


COMMAND = Command(help="write a dataset as verl-schema parquet (rlcore data NAME --help)",
                  configure=_configure, run=_run)
