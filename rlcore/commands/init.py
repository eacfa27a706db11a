"""``rlcore init [EXAMPLE]``: copy one of the example jobs that ship with rlcore into the current folder.

The examples are package data (``rlcore/examples``, the repository's ``examples/`` folder), so a
``pip install rlcore`` has the quickstart job too. Without a name the command lists them.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

from rlcore.cli import Command
from rlcore.errors import RlcoreError, did_you_mean


def example_jobs() -> dict[str, str]:
    """Example name (file name without ``.toml``) -> the job's text, as shipped in the package."""
    folder = resources.files("rlcore") / "examples"
    return {entry.name.removesuffix(".toml"): entry.read_text(encoding="utf-8")
            for entry in sorted(folder.iterdir(), key=lambda e: e.name) if entry.name.endswith(".toml")}


def _summary(text: str) -> str:
    """The first sentence of a job's opening comment: what it trains."""
    words = []
    for line in text.splitlines():
        if not line.startswith("#") or line.startswith("#  "):  # the comment ends, or a command follows
            break
        words.append(line.lstrip("#").strip())
    sentence = " ".join(words).split(". ", 1)[0]
    return sentence.rstrip(".")


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("example", nargs="?", help="the example to write (none: list them)")


def _run(args: argparse.Namespace) -> int:
    examples = example_jobs()
    if args.example is None:
        for name, text in examples.items():
            print(f"{name:<24} {_summary(text)}")
        print("\nrlcore init NAME writes NAME.toml into the current folder.")
        return 0
    name = args.example.removesuffix(".toml")
    if name not in examples:
        raise RlcoreError(f"no example named {args.example!r}{did_you_mean(name, examples)}; "
                          f"the examples are: {', '.join(examples)}")
    target = Path.cwd() / f"{name}.toml"
    if target.exists():
        raise RlcoreError(f"{target} already exists; rlcore init does not overwrite a file: remove or rename it, "
                          f"or run rlcore init from another folder")
    target.write_text(examples[name], encoding="utf-8")
    print(f"wrote {target.name}; check it with: rlcore config validate {target.name}")
    return 0


COMMAND = Command(help="write an example job (quickstart, gsm8k_grpo, ...) into the current folder",
                  configure=_configure, run=_run)
