"""The one-GPU overlap rule (docs/async.md) applied to one sitting's results: each asynchronous run of
``benchmarks/async_modes.py --out`` against the lockstep run beside it (samples per second) and against
the bare engine's generation of the same batch (``benchmarks/vllm_generation.py --results``, the log-prob
setting the job uses: ``sampler``, rollout.vllm.log_prob_source's default where the job reads log-probs).

    python benchmarks/overlap_rule.py --engine gen.jsonl overlap-pair.json [more.json ...]

The rule, at 135M (examples/gsm8k_grpo_smollm2.toml, medians of steps 2-20): a step at most 1.15x the bare
engine's generation, and at least 1.5x lockstep's samples per second. A file without a lockstep run is
compared with the lockstep run of the first file that has one (``--lockstep`` names another); a run cut
short says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

MAX_STEP_OVER_ENGINE = 1.15
MIN_SAMPLES_OVER_LOCKSTEP = 1.5


def engine_seconds(results: Path, log_probs: str) -> float | None:
    """The median seconds of the bare engine's batches with ``log_probs`` (one engine, in-process)."""
    seconds = []
    for line in results.read_text().splitlines():
        record = json.loads(line)
        if (record.get("logprobs") == log_probs and record.get("replicas") == 1 and not record.get("multiprocessing")
                and "error" not in record):
            seconds += record["seconds"]
    return statistics.median(seconds) if seconds else None


def runs_of(path: Path) -> dict[str, dict]:
    """The runs' rows of an ``async_modes.py --out`` file (its other keys are step times and profiles)."""
    table = json.loads(path.read_text())
    return {name: row for name, row in table.items() if isinstance(row, dict) and "s/step" in row}


def reference_lockstep(tables: dict[Path, dict], lockstep_file: Path | None) -> dict | None:
    """The lockstep run a file without its own is compared with: ``lockstep_file``'s, else the first file's."""
    reference = runs_of(lockstep_file) if lockstep_file else next(
        (table for table in tables.values() if "lockstep" in table), {})
    return reference.get("lockstep")


def verdicts(files: list[Path], engine_s: float | None, lockstep_file: Path | None = None) -> list[dict]:
    """One row per asynchronous run: its step, samples/s, the two ratios and whether each holds."""
    tables = {path: runs_of(path) for path in files}
    reference = reference_lockstep(tables, lockstep_file)
    rows = []
    for path, table in tables.items():
        lockstep = table.get("lockstep") or reference
        for name, row in table.items():
            if name == "lockstep" or row["s/step"] is None:
                continue
            over_lockstep = (row["samples/s"] / lockstep["samples/s"]
                             if lockstep and lockstep.get("samples/s") else None)
            over_engine = row["s/step"] / engine_s if engine_s else None
            rows.append({"file": path.name, "run": name, "s/step": row["s/step"], "samples/s": row["samples/s"],
                         "x lockstep": over_lockstep, "x engine": over_engine,
                         "holds": (over_lockstep is not None and over_engine is not None
                                   and over_lockstep >= MIN_SAMPLES_OVER_LOCKSTEP
                                   and over_engine <= MAX_STEP_OVER_ENGINE),
                         "stopped": row.get("stopped")})
    return rows


def table(rows: list[dict], engine_s: float | None, lockstep_s: float | None) -> str:
    def number(value):
        return "-" if value is None else f"{value:.2f}"

    lines = [f"bare engine {number(engine_s)} s a batch; lockstep {number(lockstep_s)} s a step", "",
             f"| file | run | s/step | samples/s | x lockstep's samples/s (>= {MIN_SAMPLES_OVER_LOCKSTEP}) "
             f"| x the bare engine (<= {MAX_STEP_OVER_ENGINE}) | rule |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        rule = "holds" if row["holds"] else "not met"
        lines.append(f"| {row['file']} | {row['run']} | {number(row['s/step'])} | {number(row['samples/s'])} | "
                     f"{number(row['x lockstep'])} | {number(row['x engine'])} | {rule}"
                     + (f" ({row['stopped']})" if row["stopped"] else "") + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="async_modes.py --out files of one sitting")
    parser.add_argument("--engine", type=Path, help="vllm_generation.py --results file of the same sitting")
    parser.add_argument("--log-probs", default="sampler", help="the bare engine's log-prob setting to compare with")
    parser.add_argument("--lockstep", type=Path, help="the file whose lockstep run the others are compared with")
    args = parser.parse_args(argv)
    engine_s = engine_seconds(args.engine, args.log_probs) if args.engine else None
    rows = verdicts(args.files, engine_s, args.lockstep)
    lockstep = reference_lockstep({path: runs_of(path) for path in args.files}, args.lockstep)
    print(table(rows, engine_s, lockstep["s/step"] if lockstep else None))


if __name__ == "__main__":
    main()
