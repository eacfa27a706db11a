"""benchmarks/open_issues_sitting.sh's queue: commands queued in separate calls run one after another in
the background (a sitting longer than one device call keeps the GPU busy between calls), each logged with
its exit status, and queue-wait hands back what they wrote."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "open_issues_sitting.sh"


def sitting(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "HOME": str(tmp_path), "SITTING_QUEUE": str(tmp_path / "queue"), "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def handed_back(tmp_path: Path) -> Path:
    """The queue's folder as queue-wait hands it back: one archive (the device machine returns 8 files)."""
    with tarfile.open(tmp_path / "out" / "queue.tar.gz") as archive:
        archive.extractall(tmp_path / "back", filter="data")
    return tmp_path / "back" / "out"


def test_queued_commands_run_in_order_after_each_other_and_come_back(tmp_path):
    sitting(tmp_path, "queue", "--", "sleep 2; echo first >> $OUT/order")
    sitting(tmp_path, "queue", "--", "echo second >> $OUT/order; exit 3")
    sitting(tmp_path, "queue", "--", "echo third >> $OUT/order")
    shown = sitting(tmp_path, "queue-wait", "--timeout", "40")

    out = handed_back(tmp_path)
    assert (out / "order").read_text().split() == ["first", "second", "third"]
    logs = sorted((out / "logs").glob("*.log"))
    assert [log.name for log in logs] == ["01.log", "02.log", "03.log"]
    assert logs[1].read_text().splitlines()[-1].endswith("exit 3")
    assert logs[2].read_text().splitlines()[-1].endswith("exit 0")
    assert "still running" not in shown and "== 02.log" in shown


def test_queue_wait_says_when_the_queue_outlasts_it(tmp_path):
    sitting(tmp_path, "queue", "--", "sleep 5; echo late > $OUT/late")
    assert "still running" in sitting(tmp_path, "queue-wait", "--timeout", "2")
    sitting(tmp_path, "queue-wait", "--timeout", "30")
    assert (handed_back(tmp_path) / "late").read_text() == "late\n"


def test_queue_without_a_command_is_refused(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "SITTING_QUEUE": str(tmp_path / "queue")}
    done = subprocess.run(["bash", str(SCRIPT), "queue"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "queue needs a command" in done.stdout


def test_a_plan_file_queues_its_commands_in_order_past_comments_and_blank_lines(tmp_path):
    plan = tmp_path / "plan.sh"
    plan.write_text("# the sitting's plan\n\necho one >> $OUT/order\n  # indented comment\necho 'two words' >> $OUT/order\n")
    shown = sitting(tmp_path, "queue-file", str(plan))
    assert shown.count("queued") == 2
    sitting(tmp_path, "queue-wait", "--timeout", "30")
    assert (handed_back(tmp_path) / "order").read_text() == "one\ntwo words\n"


@pytest.mark.parametrize("plan", sorted((SCRIPT.parent / "plans").glob("*.sh")), ids=lambda path: path.name)
def test_the_plans_name_only_parts_and_scripts_that_exist(plan):
    commands = [line for line in plan.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands, plan
    parts = SCRIPT.read_text()
    for command in commands:
        words = command.split()
        script = next(w for w in words if w.startswith("benchmarks/"))
        assert (SCRIPT.parents[1] / script).is_file(), command
        if script.endswith("open_issues_sitting.sh"):
            part = words[words.index(script) + 1]
            assert f"\n  {part})" in parts or f"|{part})" in parts or f"{part}|" in parts, command


@pytest.mark.parametrize("plan", sorted((SCRIPT.parent / "plans").glob("*.sh")), ids=lambda path: path.name)
def test_the_plans_run_the_compile_probe_through_the_part_that_installs_rlcore(plan):
    """Run from the bare checkout on the GPU machine (2026-12-07), the probe found no training backend:
    rlcore's entry points exist once it is installed, which the sitting's parts do first."""
    for line in plan.read_text().splitlines():
        if "compile_probe.py" in line and not line.lstrip().startswith("#"):
            assert "open_issues_sitting.sh probe " in line.split("compile_probe.py")[0], line
        if "open_issues_sitting.sh probe " in line:
            assert "compile_probe.py" not in line  # the part names the script itself
