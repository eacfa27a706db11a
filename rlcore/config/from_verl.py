"""``rlcore config from-verl SCRIPT.sh``: a verl launch script -> an rlcore TOML job, saying what was
mapped, ignored (and why) and refused."""

from __future__ import annotations

import sys
from pathlib import Path

import tomli_w

from rlcore.config import load_job
from rlcore.config.overrides import apply_overrides, parse_override, translate_verl
from rlcore.config.verl_script import read_script
from rlcore.errors import ConfigError


def from_verl(script: str, output: str | None) -> int:
    """Write the job (or print it); report to stderr. Exit 2 when a key was refused or is unknown:
    the job is still written without it."""
    try:
        text = Path(script).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"verl script {script} cannot be read: {exc.strerror}"]) from None
    verl_script = read_script(text)
    given = verl_script.overrides
    parsed = [parse_override(item) for item in given]
    kept, ignored, renamed, refused = translate_verl(parsed)
    raw: dict = {}
    apply_overrides(raw, kept)
    job_text = f"# from {Path(script).name} (verl) by rlcore config from-verl\n" + tomli_w.dumps(raw)
    for override in kept:
        if override.verl_key:
            print(f"mapped: {override.verl_key} -> {override.key} = {override.value!r}", file=sys.stderr)
        else:
            print(f"same key: {override.key} = {override.value!r}", file=sys.stderr)
    for note in verl_script.notes + renamed:
        print(f"note: {note}", file=sys.stderr)
    for warning in verl_script.ignored + ignored:
        print(f"ignored: {warning}", file=sys.stderr)
    problems = list(refused)
    try:
        load_job(None, given, check=False)
    except ConfigError as exc:
        problems += [p for p in exc.problems if p not in refused]
    for problem in problems:
        print(f"refused: {problem}", file=sys.stderr)
    if output:
        Path(output).write_text(job_text, encoding="utf-8")
        print(f"wrote {output}: {len(kept)} settings, {len(verl_script.ignored) + len(ignored)} ignored, "
              f"{len(problems)} refused",
              file=sys.stderr)
    else:
        sys.stdout.write(job_text)
    return 2 if problems else 0
