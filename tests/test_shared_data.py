"""Tests that read the shared data folder find it through RLCORE_TEST_SHARED; without it they skip
saying why, and in CI (RLCORE_CI=1, set by .ci/run) they fail instead of skipping."""

from __future__ import annotations

import ast
import os
import sys

from tests.conftest import REPO
from tests.processes import run_process

# reads GSM8K from the shared folder; no Ray, no model: seconds
READER = "tests/data/test_gsm8k.py::test_local_jsonl_becomes_verl_schema"


def _pytest(tmp_path, *, ci: bool):
    env = {k: v for k, v in os.environ.items() if k not in ("RLCORE_CI", "PYTEST_ADDOPTS")}
    env["RLCORE_TEST_SHARED"] = str(tmp_path / "no-shared-here")
    if ci:
        env["RLCORE_CI"] = "1"
    return run_process([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", READER],
                       name=f"pytest {READER}", timeout=180, env=env, cwd=str(REPO))


def test_missing_shared_data_is_a_skip_with_a_reason_and_a_failure_in_ci(tmp_path):
    outside = _pytest(tmp_path, ci=False)
    assert outside.returncode == 0, outside.stdout
    assert "1 skipped" in outside.stdout
    assert f"GSM8K is not available at {tmp_path / 'no-shared-here'}" in outside.stdout  # -rs shows where

    in_ci = _pytest(tmp_path, ci=True)
    assert in_ci.returncode == 1, in_ci.stdout
    assert "CI (RLCORE_CI=1) must run the tests that read it" in in_ci.stdout


def test_only_tests_conftest_names_the_shared_folder():
    """Every test reaches the shared data through tests.conftest.SHARED, which honours
    RLCORE_TEST_SHARED; a path spelled out elsewhere would ignore it."""
    spelled = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path in (REPO / "tests" / "conftest.py", REPO / "tests" / "test_shared_data.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in ("shared", "../shared"):
                spelled.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not spelled, f"use tests.conftest.SHARED instead: {spelled}"
