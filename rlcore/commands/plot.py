"""``rlcore plot RUN_DIR [RUN_DIR ...] [--metrics ...] [--out DIR] [--svg]``: charts of runs' metrics."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlcore.cli import Command
from rlcore.runs.plot import DEFAULT_METRICS, plot_runs


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (trainer.default_local_dir) "
                        "or metrics.jsonl files; several are drawn on the same charts")
    parser.add_argument("--metrics", nargs="+", default=list(DEFAULT_METRICS), metavar="NAME",
                        help="the charts: metric names, * matches any part (default: the usual curves)")
    parser.add_argument("--out", default="plots", help="folder for the charts (default: plots)")
    parser.add_argument("--svg", action="store_true", help="write SVG files beside the PNG ones")


def _run(args: argparse.Namespace) -> int:
    written = plot_runs([Path(r) for r in args.runs], Path(args.out), tuple(args.metrics),
                        ("png", "svg") if args.svg else ("png",))
    for path in written:
        print(path)
    return 0


COMMAND = Command(help="draw charts of runs' metrics (needs rlcore[plot])", configure=_configure, run=_run)
