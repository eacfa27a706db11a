"""README.md stays a short door: its two commands are the quickstart and what CI runs, and every
relative link it (and CONTRIBUTING.md) makes points at a file of the repository."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S)]


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 200


def test_the_first_two_commands_are_the_quickstart_and_the_ci_test_command():
    quickstart, tests = bash_blocks(README)[:2]
    assert quickstart.endswith("rlcore data arithmetic --local-save-dir data/arithmetic && rlcore train "
                               "examples/quickstart.toml")
    assert (REPO / "examples" / "quickstart.toml").is_file()
    assert tests.endswith("python -m pytest -q -rs")


def test_ci_runs_the_readme_test_command_as_it_is_written():
    """.ci/run reads the command out of README.md and runs its two halves, install then pytest: what
    those halves print, joined, is the README's command."""
    tests = bash_blocks(README)[1]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    reading = next(line for line in ci.splitlines() if line.startswith("readme_tests=$("))
    halves = [line.strip() for line in ci.splitlines() if line.startswith('eval "')]
    assert len(halves) == 2, halves
    script = f"cd {REPO}\n{reading}\n" + "\n".join(h.replace("eval ", "printf '%s\\n' ", 1) for h in halves)
    install, pytest_run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                                         timeout=30).stdout.splitlines()
    assert f"{install} && {pytest_run}" == tests
    assert pytest_run == "python -m pytest -q -rs"


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md"])
def test_relative_links_point_at_files(name):
    text = re.sub(r"`[^`]*`", "", (REPO / name).read_text(encoding="utf-8"))  # code spans are not links
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)]+)\)", text) if "://" not in t]
    assert targets or name == "CONTRIBUTING.md"
    missing = [t for t in targets if t and not (REPO / t).exists()]
    assert not missing, f"{name} links to files that do not exist: {missing}"
