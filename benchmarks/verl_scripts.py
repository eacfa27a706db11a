"""How many of verl's example scripts that run ``main_ppo`` rlcore takes as they are: each script's
overrides (``rlcore.config.verl_script.read_script``: the Hydra overrides after ``main_ppo``,
shell variables expanded, led by what its ``--config-name`` implies) checked as ``rlcore config
validate --keys-only`` checks them (keys, values, names and cross-field rules; not files, folders or
libraries, since the scripts' data paths are elsewhere). The scripts are read where they are, in a
verl checkout or a bare clone, never copied.

    python benchmarks/verl_scripts.py --git-dir VERL/.git --commit 1dda039     # a clone, at a commit
    python benchmarks/verl_scripts.py --checkout VERL                          # a working tree

Prints the count that validate, then every refused or unknown key with the number of scripts that
use it, then each failing script with its problems (``--verbose``).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
from pathlib import Path

from rlcore.config import load_job
from rlcore.config.verl_script import read_script
from rlcore.errors import ConfigError


def scripts_of_git(git_dir: str, commit: str) -> dict[str, str]:
    names = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", commit, "examples"],
                           check=True, capture_output=True, text=True, timeout=60).stdout.split()
    texts = {}
    for name in names:
        if name.endswith(".sh"):
            texts[name] = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{name}"], check=True,
                                         capture_output=True, text=True, timeout=60).stdout
    return texts


def scripts_of_checkout(root: str) -> dict[str, str]:
    base = Path(root)
    return {str(p.relative_to(base)): p.read_text(encoding="utf-8") for p in sorted((base / "examples").rglob("*.sh"))}


def runs_main_ppo(text: str) -> bool:
    return re.search(r"verl\.trainer\.main_ppo", text) is not None  # main_ppo_sync too


def problem_key(problem: str) -> str:
    """The key a problem is about: ``key=value is refused: ...``, ``key: ...``."""
    return re.split(r"[=: ]", problem, maxsplit=1)[0]


def measure(texts: dict[str, str]) -> tuple[list[str], dict[str, list[str]]]:
    """(scripts that validate, {script: problems} for the others), over the scripts that run main_ppo."""
    passed, failed = [], {}
    for name, text in sorted(texts.items()):
        if not runs_main_ppo(text):
            continue
        try:
            load_job(None, read_script(text).overrides, check=True, machine=False)
            passed.append(name)
        except ConfigError as exc:
            failed[name] = list(exc.problems)
    return passed, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--git-dir", help="a verl clone's git directory (bare or .git)")
    source.add_argument("--checkout", help="a verl working tree")
    parser.add_argument("--commit", default="HEAD", help="the commit to read, with --git-dir")
    parser.add_argument("--verbose", action="store_true", help="list each failing script's problems")
    args = parser.parse_args()
    texts = scripts_of_git(args.git_dir, args.commit) if args.git_dir else scripts_of_checkout(args.checkout)
    passed, failed = measure(texts)
    print(f"{len(passed)} of {len(passed) + len(failed)} scripts that run main_ppo validate (keys only)")
    by_key = collections.Counter(key for problems in failed.values() for key in {problem_key(p) for p in problems})
    for key, count in sorted(by_key.items(), key=lambda item: (-item[1], item[0])):
        print(f"{count:4d}  {key}")
    if args.verbose:
        for name, problems in failed.items():
            print(f"\n{name}")
            for problem in problems:
                print(f"    {problem}")


if __name__ == "__main__":
    main()
