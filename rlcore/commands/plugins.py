"""``rlcore plugins [--json]``: what is installed, what each plugin registered, and what failed."""

from __future__ import annotations

import argparse
import json

from rlcore.cli import Command
from rlcore.plugins.manager import get_manager


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print as JSON")


def _run(args: argparse.Namespace) -> int:
    manager = get_manager()
    info = get_manager().describe()
    for plugin in info["plugins"]:
        plugin["missing"] = _missing(manager, plugin["registered"])
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for plugin in info["plugins"]:
        origin = f"{plugin['distribution']} {plugin['version']}"
        via = f", entry point {plugin['entry_point']}" if plugin["entry_point"] else ", built in"
        print(f"{plugin['name']} ({origin}{via})")
        if not plugin["registered"]:
            print("    registers nothing")
        for kind, names in plugin["registered"].items():
            shown = [f"{n} (default)" if plugin["defaults"].get(kind) == n else n for n in names]
            print(f"    {kind}: {', '.join(shown)}")
        for name, modules in plugin["missing"].items():
            print(f"    {name}: NOT READY, {', '.join(modules)} is not installed (pip install 'rlcore[{name}]')")
    for failed in info["failed"]:
        print(f"{failed['name']} ({failed['distribution']} {failed['version']}, "
              f"entry point {failed['entry_point']}) FAILED TO LOAD")
        for line in failed["error"].splitlines():
            print(f"    {line}")
    return 0


def _missing(manager, registered: dict[str, list[str]]) -> dict[str, list[str]]:
    """For each registered name whose library is not installed, the missing modules."""
    from rlcore.runs.preflight import missing_modules  # torch: when the command runs, not when rlcore starts

    missing = {}
    for kind, names in registered.items():
        for name in names:
            modules = missing_modules(manager.get(kind, name))
            if modules:
                missing[name] = modules
    return missing


COMMAND = Command(help="list plugins and what they register", configure=_configure, run=_run)
