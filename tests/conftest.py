"""Shared fixtures: plugin packages installed into a temporary directory, never into the venv; the
project's shared data; the ``rlcore`` CLI run in a child process with a deadline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import run_process

REPO = Path(__file__).resolve().parent.parent
# the project's shared data (GSM8K) sits beside the repository in CI; RLCORE_TEST_SHARED points elsewhere
SHARED = Path(os.environ.get("RLCORE_TEST_SHARED", REPO.parent / "shared"))
# .ci/run sets RLCORE_CI=1: there, missing shared data is a failure, not a skip, so that the whole-job
# tests cannot all skip while CI stays green
IN_CI = os.environ.get("RLCORE_CI") == "1"


def require_shared(path: Path, what: str) -> Path:
    """``path`` under the shared data folder; a skip that says why when it is missing (a failure in CI)."""
    if path.exists():
        return path
    why = (f"{what} is not available at {path} (the shared data folder beside the repository; "
           f"RLCORE_TEST_SHARED points elsewhere)")
    if IN_CI:
        pytest.fail(f"{why}: CI (RLCORE_CI=1) must run the tests that read it")
    pytest.skip(why)


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory) -> Path:
    """A directory holding the example plugin and a broken plugin, installed with pip --target."""
    target = tmp_path_factory.mktemp("plugin-site")
    packages = [REPO / "plugins" / "rlcore-example", REPO / "tests" / "fixtures" / "rlcore-broken"]
    result = run_process(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--no-index", "--target", str(target), *map(str, packages)],
        name="pip install of the test plugins", timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return target


def run_rlcore(*args: str, site: Path | None = None, env: dict | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the ``rlcore`` CLI in a fresh process (optionally with extra plugins on the path); past
    ``timeout`` seconds its process group is killed and the test fails, naming the command."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLCORE_")}
    if site is not None:
        full_env["PYTHONPATH"] = os.pathsep.join([str(site), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env.update(env or {})
    return run_process([sys.executable, "-m", "rlcore", *args], name=_job_name(args), timeout=timeout,
                       env=full_env, cwd=str(REPO))


def _job_name(args: tuple[str, ...]) -> str:
    """``rlcore <command> ...`` with the run folder when there is one: what a timeout names."""
    words = [a for a in args if "=" not in a][:3]
    run_dir = [a.split("=", 1)[1] for a in args if a.startswith("trainer.default_local_dir=")]
    return "`rlcore " + " ".join(words) + "`" + (f" (run folder {run_dir[0]})" if run_dir else "")


def pytest_collection_modifyitems(items):
    """Every test under tests/e2e runs whole jobs (Ray, a CLI subprocess): ``slow``, so that
    ``-m "not slow"`` is the fast loop (CONTRIBUTING.md)."""
    e2e = Path(__file__).parent / "e2e"
    for item in items:
        if e2e in Path(item.fspath).parents:
            item.add_marker(pytest.mark.slow)
