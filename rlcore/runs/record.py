"""The run folder as a record of what produced it (docs/run-output.md).

At the start of ``rlcore train`` the run folder gets:

- ``run.toml``: the resolved job, defaults included (``rlcore config show``'s text), loadable as a job;
- ``overrides.txt``: the job file and the command-line overrides as typed, one a line;
- ``environment.json``: versions of rlcore and the libraries it ran with, and the machine.

A resumed run compares the job it runs with the ``run.toml`` the last start left and warns, naming
each key that changed. The record is written again where the job changes as its workers start (a
colocated job whose device sharing did not start takes another arrangement), so that it holds the job
that ran. ``metrics.jsonl`` is cut back to the step a run resumes from, so
that steps run again after a crash appear once.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from rlcore.config.load import tomllib
from rlcore.runs.preflight import declared_modules
from rlcore.runtime.atomic import publish, staging_file

RUN_CONFIG = "run.toml"
OVERRIDES = "overrides.txt"
ENVIRONMENT = "environment.json"
METRICS = "metrics.jsonl"

# Distributions whose versions go into environment.json when installed; the libraries the job's backend
# and engine declare (their ``requires``) join them.
DISTRIBUTIONS = ("rlcore", "torch", "transformers", "ray", "numpy", "pyarrow", "accelerate", "peft", "wandb",
                 "tensorboard", "mlflow", "mlflow-skinny")


def _write(path: Path, text: str) -> None:
    staged = staging_file(path)
    staged.write_text(text, encoding="utf-8")
    publish(staged, path)


def versions(modules: tuple[str, ...] = ()) -> dict[str, str]:
    """Installed versions of ``DISTRIBUTIONS`` and of the distributions that provide ``modules``
    (dotted names count by their top package); absent ones are left out."""
    providers = metadata.packages_distributions() if modules else {}
    names = list(DISTRIBUTIONS)
    for module in modules:
        names += [name for name in providers.get(module.split(".")[0], []) if name not in names]
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def machine(device_platform=None) -> dict:
    """The driver's machine: OS, Python, CPUs and the accelerator devices its platform sees."""
    info = {"platform": platform.platform(), "python": sys.version.split()[0], "hostname": platform.node(),
            "cpu_count": os.cpu_count()}
    if device_platform is not None:
        count = device_platform.device_count()
        info |= {"device_type": device_platform.device_type, "device_count": count,
                 "devices": [device_platform.device_name(i) for i in range(count)]}
    return info


def environment(device_platform=None, engine: str | None = None, backend: str | None = None, manager=None) -> dict:
    """What environment.json records; with the plugin manager, the versions of the libraries the
    chosen engine and backend declare too."""
    modules: tuple[str, ...] = ()
    if manager is not None:
        chosen = [("rollout_engines", engine), ("training_backends", backend)]
        modules = tuple(m for kind, name in chosen if name in manager.registry(kind)
                        for m in declared_modules(manager.get(kind, name)))
    return {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "engine": engine,
            "backend": backend, "versions": versions(modules), "machine": machine(device_platform)}


def _flatten(data: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat |= _flatten(value, path + ".")
        else:
            flat[path] = value
    return flat


def changed_keys(previous_toml: str, current_toml: str) -> list[str]:
    """``key: old -> new`` for every key whose value differs between two ``run.toml`` texts."""
    before, after = _flatten(tomllib.loads(previous_toml)), _flatten(tomllib.loads(current_toml))
    missing = object()
    lines = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, missing), after.get(key, missing)
        if old != new:
            lines.append(f"{key}: {'unset' if old is missing else repr(old)} -> "
                         f"{'unset' if new is missing else repr(new)}")
    return lines


def previous_record(run_dir: Path) -> str | None:
    """The run folder's ``run.toml`` as the last start left it (a resumed run's job), or None for a new one."""
    path = run_dir / RUN_CONFIG
    return path.read_text(encoding="utf-8") if path.is_file() else None


def write_record(run_dir: Path, config_toml: str, source: str | None, overrides: tuple[str, ...],
                 env: dict) -> None:
    """Write run.toml, overrides.txt and environment.json (``previous_record`` reads the run.toml there
    first, for ``changed_keys``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    _write(run_dir / RUN_CONFIG, config_toml)
    lines = [f"# job file: {source}" if source else "# no job file", *overrides]
    _write(run_dir / OVERRIDES, "\n".join(lines) + "\n")
    _write(run_dir / ENVIRONMENT, json.dumps(env, indent=2, sort_keys=True) + "\n")


def cut_metrics(run_dir: Path, step: int) -> int:
    """Keep only ``metrics.jsonl`` records of steps up to ``step`` (all records when a run resumes
    at ``step``, none when it starts at 0), rewritten atomically; returns how many were dropped. A torn
    last line (a crash while writing) is dropped too."""
    path = run_dir / METRICS
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record_step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            dropped += 1
            continue
        if step > 0 and record_step <= step:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        _write(path, "".join(f"{line}\n" for line in kept))
    return dropped
