"""Charts of runs' metrics.jsonl (``rlcore plot``): one PNG (or SVG) per metric, every run overlaid.

matplotlib is an extra (``pip install 'rlcore[plot]'``); it draws with the Agg backend, no display.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rlcore.errors import RlcoreError

# The curves people look at first; a chart is drawn for those some run has.
DEFAULT_METRICS = ("critic/score/mean", "val-core/*/reward/mean@*", "response_length/mean", "actor/kl_loss",
                   "actor/reward_kl_penalty", "actor/entropy", "actor/pg_loss", "actor/grad_norm",
                   "timing_s/step", "timing_share/gen")


def read_run(run_dir: Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` (or of the file given), in step order; a torn last line
    is skipped."""
    path = run_dir if run_dir.is_file() else run_dir / "metrics.jsonl"
    if not path.is_file():
        raise RlcoreError(f"{run_dir}: no metrics.jsonl (give a run folder, trainer.default_local_dir)")
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return sorted(records, key=lambda r: r.get("step", 0))


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) where ``key`` has a finite number."""
    points = [(r["step"], float(r[key])) for r in records
              if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [s for s, _ in points], [v for _, v in points]


def expand(patterns: tuple[str, ...], runs: dict[str, list[dict]]) -> list[str]:
    """Metric names matching ``patterns`` (``*`` is a wildcard) that some run has, in pattern order."""
    from fnmatch import fnmatchcase

    present = sorted({k for records in runs.values() for r in records for k in r if k != "step"})
    keys: list[str] = []
    for pattern in patterns:
        keys += [k for k in present if fnmatchcase(k, pattern) and k not in keys]
    return keys


def file_name(key: str) -> str:
    return key.replace("/", "_").replace("@", "_at_")


def plot_runs(run_dirs: list[Path], out: Path, metrics: tuple[str, ...] = DEFAULT_METRICS,
              formats: tuple[str, ...] = ("png",)) -> list[Path]:
    """Write one chart per metric into ``out``; returns the files written."""
    try:
        import matplotlib
    except ImportError:
        raise RlcoreError("rlcore plot needs matplotlib: pip install 'rlcore[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    runs = {_label(d, run_dirs): read_run(d) for d in run_dirs}
    keys = expand(metrics, runs)
    if not keys:
        raise RlcoreError(f"none of the metrics {', '.join(metrics)} is in {', '.join(map(str, run_dirs))} "
                          "(--metrics picks others; * matches any part of a name)")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key in keys:
        figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
        for label, records in runs.items():
            steps, values = series(records, key)
            if steps:
                axes.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
        axes.set_title(key, fontsize=10)
        axes.set_xlabel("step")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        axes.ticklabel_format(axis="y", useOffset=False)  # values as they are, not "+6.222" and a remainder
        axes.grid(alpha=0.3)
        if len(runs) > 1:
            axes.legend(fontsize=8)
        figure.tight_layout()
        for extension in formats:
            path = out / f"{file_name(key)}.{extension}"
            figure.savefig(path)
            written.append(path)
        plt.close(figure)
    return written


def _label(run_dir: Path, all_dirs: list[Path]) -> str:
    """The shortest tail of the path that tells the runs apart."""
    parts = run_dir.resolve().parts
    for length in range(1, len(parts) + 1):
        tails = ["/".join(d.resolve().parts[-length:]) for d in all_dirs]
        if len(set(tails)) == len(tails):
            return "/".join(parts[-length:])
    return str(run_dir)
