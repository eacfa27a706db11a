"""``rlcore init``: the example jobs ship with the package, and the command writes one into the current
folder without ever overwriting a file."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rlcore.commands.init import example_jobs
from tests.conftest import REPO
from tests.processes import run_process


def rlcore_in(folder: Path, *args: str):
    """The ``rlcore`` CLI in a fresh process whose current folder is ``folder``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCORE_")}
    return run_process([sys.executable, "-m", "rlcore", *args], name=f"rlcore {' '.join(args)}", timeout=120,
                       env=env, cwd=str(folder))


def test_the_packaged_examples_are_the_repository_examples():
    """One copy: the package's examples folder is the repository's examples/, not a second copy."""
    packaged = REPO / "rlcore" / "examples"
    assert packaged.is_symlink() and packaged.resolve() == (REPO / "examples").resolve()
    on_disk = {p.stem: p.read_text(encoding="utf-8") for p in sorted((REPO / "examples").glob("*.toml"))}
    assert example_jobs() == on_disk
    assert "quickstart" in on_disk


def test_init_without_a_name_lists_every_example(tmp_path):
    result = rlcore_in(tmp_path, "init")
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines()[:len(example_jobs())]]
    assert listed == sorted(example_jobs())
    assert "Quickstart: GRPO on SmolLM2-135M-Instruct" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_init_writes_the_quickstart_and_config_validate_accepts_it(tmp_path):
    result = rlcore_in(tmp_path, "init", "quickstart")
    assert result.returncode == 0, result.stderr
    written = tmp_path / "quickstart.toml"
    assert written.read_text(encoding="utf-8") == (REPO / "examples" / "quickstart.toml").read_text(encoding="utf-8")

    # the job names data/arithmetic/*.parquet relative to the current folder: make it, then check
    # the job as `rlcore train` would, files and model included
    data = rlcore_in(tmp_path, "data", "arithmetic", "--local-save-dir", "data/arithmetic")
    assert data.returncode == 0, data.stderr
    validate = rlcore_in(tmp_path, "config", "validate", "quickstart.toml")
    assert validate.returncode == 0, validate.stderr
    assert "quickstart.toml: OK" in validate.stdout


def test_init_never_overwrites_a_file(tmp_path):
    existing = tmp_path / "gsm8k_ppo.toml"
    existing.write_text("# my own job\n", encoding="utf-8")
    result = rlcore_in(tmp_path, "init", "gsm8k_ppo.toml")
    assert result.returncode == 2
    assert "gsm8k_ppo.toml already exists" in result.stderr and "Traceback" not in result.stderr
    assert existing.read_text(encoding="utf-8") == "# my own job\n"


def test_init_of_an_unknown_example_lists_the_known_ones(tmp_path):
    result = rlcore_in(tmp_path, "init", "quikstart")
    assert result.returncode == 2
    assert 'did you mean "quickstart"' in result.stderr
    assert all(name in result.stderr for name in example_jobs())
    assert list(tmp_path.iterdir()) == []
