"""benchmarks/log_prob_memory.py on the CPU, at a size that takes a second: one JSON line per form, and a form
that fails says why (its own error), not only that it failed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "log_prob_memory.py"


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_each_form_gives_its_peak_and_seconds(tmp_path):
    done = bench("--tokens", "64", "--vocab", "300", "--entropy", "--repeats", "2", "--forms", "plain", "chunked",
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [row["form"] for row in rows] == ["plain", "chunked"]
    assert all(row["entropy"] and row["grad"] and row["seconds"] > 0 and row["tokens"] == 64 for row in rows)


def test_a_form_that_fails_shows_its_error(tmp_path):
    done = bench("--tokens", "64", "--vocab", "0", "--forms", "chunked", cwd=tmp_path)
    assert done.returncode != 0
    assert "the chunked form failed" in done.stderr and "Traceback" in done.stderr, done.stderr
