"""Shared fixtures: plugin packages installed into a temporary directory, never into the venv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# the project's shared data (GSM8K) sits beside the repository in CI; RLCORE_TEST_SHARED points elsewhere
SHARED = Path(os.environ.get("RLCORE_TEST_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory) -> Path:
    """A directory holding the example plugin and a broken plugin, installed with pip --target."""
    target = tmp_path_factory.mktemp("plugin-site")
    packages = [REPO / "plugins" / "rlcore-example", REPO / "tests" / "fixtures" / "rlcore-broken"]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--no-index", "--target", str(target), *map(str, packages)],
        check=True, capture_output=True, text=True,
    )
    return target


def run_rlcore(*args: str, site: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the ``rlcore`` CLI in a fresh process (optionally with extra plugins on the path)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLCORE_")}
    if site is not None:
        full_env["PYTHONPATH"] = os.pathsep.join([str(site), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "rlcore", *args], capture_output=True, text=True,
                          env=full_env, cwd=str(REPO))
