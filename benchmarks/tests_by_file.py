"""A test directory run one file per pytest process under a budget of seconds, resumable: the GPU
machine's calls last at most ten minutes, and ``tests/vllm`` takes longer than one, so the same command is
sent again in the next call (back to back, the machine still warm) and goes on with the files not yet
run. Each file's output and exit status stay in ``--results``; ``table`` prints what they say.

    python benchmarks/tests_by_file.py run tests/vllm --results .gpu-data/vllm-0.26.0 --budget 560 -- -s
    python benchmarks/tests_by_file.py table .gpu-data/vllm-0.26.0

A file is started only when the time left is at least ``--min-start`` seconds; one still running when
the budget ends is stopped (its whole process group) and recorded as cut short, and is run again, from
its start, by the next call, unless it had the whole call to itself: then it does not fit in one call
and is recorded as cut short, not run again. ``--first`` puts named files ahead of the others (the slow ones, to give
them a whole call). Extra pytest arguments follow ``--``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

# pytest's last line: "== 3 passed, 1 skipped, 2 warnings in 4.21s ==" (or "no tests ran")
OUTCOMES = ("failed", "passed", "skipped", "error", "errors", "xfailed", "xpassed", "deselected")
SUMMARY = re.compile(r"(\d+) (" + "|".join(OUTCOMES) + r")\b")
SECONDS = re.compile(r" in ([\d.]+)s")


def test_files(directory: Path, first: list[str]) -> list[Path]:
    """The directory's test files, those named in ``first`` (file names) ahead, the rest in name order."""
    files = sorted(directory.rglob("test_*.py"))
    named = [f for name in first for f in files if f.name == name]
    return named + [f for f in files if f not in named]


def record_of(results: Path, file: Path) -> dict | None:
    path = results / f"{file.name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def counts(output: str) -> dict[str, int]:
    """The outcome counts of pytest's summary line (its last line that has any)."""
    for line in reversed(output.splitlines()):
        found = SUMMARY.findall(line)
        if found:
            total: dict[str, int] = {}
            for number, outcome in found:
                outcome = "error" if outcome == "errors" else outcome
                total[outcome] = total.get(outcome, 0) + int(number)
            return total
    return {}


def run_file(file: Path, results: Path, seconds: float, pytest_args: list[str], whole_call: bool = False) -> dict:
    """``pytest FILE`` in a process group of its own, stopped at ``seconds``; its record, also written
    to ``results`` (the output beside it) unless it was cut short with only part of the call to run in."""
    command = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", str(file), *pytest_args]
    log = results / f"{file.name}.log"
    start = time.monotonic()
    with log.open("w") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = process.wait(timeout=seconds)
            cut = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            status, cut = process.wait(), True
    output = log.read_text(errors="replace")
    record = {"file": str(file), "status": status, "cut_short": cut, "seconds": round(time.monotonic() - start, 1),
              "counts": counts(output)}
    if cut:
        record["cut_at_s"] = round(seconds)
    if whole_call or not cut:
        (results / f"{file.name}.json").write_text(json.dumps(record) + "\n")
    return record


def run(directory: Path, results: Path, budget: float, min_start: float, first: list[str],
        pytest_args: list[str]) -> list[dict]:
    """Every file of ``directory`` without a record in ``results``, in turn, within ``budget`` seconds."""
    results.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget
    done: list[dict] = []
    for file in test_files(directory, first):
        if record_of(results, file) is not None:
            continue
        left = deadline - time.monotonic()
        if left < min_start:
            print(f"{file}: not started, {left:.0f} s left (--min-start {min_start:g}); send the same command again",
                  flush=True)
            break
        record = run_file(file, results, left, pytest_args, whole_call=not done)
        done.append(record)
        print(f"{file}: {describe(record)}", flush=True)
    return done


def describe(record: dict) -> str:
    found = ", ".join(f"{n} {outcome}" for outcome, n in sorted(record["counts"].items())) or "no summary"
    if record.get("cut_short"):
        return f"cut short at {record['cut_at_s']} s ({found} before it)"
    return f"{found} ({record['seconds']:g} s, exit status {record['status']})"


def table(results: Path, directory: Path | None = None) -> str:
    """Markdown: one row per file with a record (and, given ``directory``, one per file still to run)."""
    rows = ["| file | result |", "|---|---|"]
    records = {Path(r["file"]).name: r for r in (json.loads(p.read_text()) for p in sorted(results.glob("*.json")))}
    for name, record in records.items():
        rows.append(f"| {name} | {describe(record)} |")
    if directory is not None:
        for file in test_files(directory, []):
            if file.name not in records:
                rows.append(f"| {file.name} | not run |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="run the files not yet run")
    go.add_argument("directory", type=Path)
    go.add_argument("--results", type=Path, required=True, help="a folder: each file's log and record")
    go.add_argument("--budget", type=float, default=560, help="seconds this call may take in all")
    go.add_argument("--min-start", type=float, default=60, help="start no file with fewer seconds left")
    go.add_argument("--first", nargs="*", default=[], help="file names to run before the others")
    show = commands.add_parser("table", help="what the records say")
    show.add_argument("results", type=Path)
    show.add_argument("--directory", type=Path, help="list this directory's files not yet run too")
    # pytest's arguments are what follows "--", split off here: argparse refuses a "--" after an option
    # of many values (--first) in a sub-command, the documented command's form
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    args = parser.parse_args(argv)
    if args.command == "run":
        done = run(args.directory, args.results, args.budget, args.min_start, args.first, pytest_args)
        print(table(args.results, args.directory))
        return 1 if any(r["status"] != 0 and not r.get("cut_short") for r in done) else 0
    print(table(args.results, args.directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
