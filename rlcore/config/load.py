"""Read a job: TOML file + overrides -> a validated ``JobConfig``, reporting every problem at once."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import attrs

from rlcore.config.checks import check_job
from rlcore.config.convert import Problems, structure
from rlcore.config.overrides import (
    Override,
    apply_overrides,
    conflicting_verl_keys,
    parse_override,
    translate_verl,
    verl_mapping,
)
from rlcore.config.schema import JobConfig
from rlcore.errors import ConfigError, RlcoreError
from rlcore.plugins.manager import get_manager

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@attrs.frozen
class Job:
    """A resolved job: its config, the keys the user set, and what the loader has to say."""

    config: JobConfig
    set_keys: frozenset[str]  # dotted paths given in the file or on the command line
    notes: tuple[str, ...] = ()  # e.g. where each verl key landed
    warnings: tuple[str, ...] = ()
    source: str | None = None
    overrides: tuple[str, ...] = ()  # as typed on the command line (the run folder's overrides.txt)


def read_toml(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"job file {path} does not exist"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"job file {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); TOML files "
                           "are UTF-8"]) from None
    except OSError as exc:
        raise ConfigError([f"job file {path} cannot be read: {exc.strerror}"]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path} is not valid TOML: {exc}"]) from None


def _dotted_keys(data: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in data.items():
        path = f"{prefix}{key}"
        keys.add(path)
        if isinstance(value, dict):
            keys |= _dotted_keys(value, path + ".")
    return keys


def _pop_path(data: dict, path: str) -> Any:
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.get(part)
        if not isinstance(node, dict):
            return None
    return node.pop(last, None)


def _get_path(data: dict, path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def build_config(raw: dict, section_classes: dict[str, type]) -> JobConfig:
    """Structure raw TOML data; plugin-owned tables go to the classes their plugins registered."""
    raw = copy.deepcopy(raw)
    problems: list[tuple[str, str]] = []
    sections = {}
    for path, cls in sorted(section_classes.items()):
        table = _pop_path(raw, path)
        try:
            sections[path] = structure(table if table is not None else {}, cls)
        except Problems as exc:
            problems += [(f"{path}.{p}" if p else path, m) for p, m in exc.problems]
    try:
        config = structure(raw, JobConfig)
    except Problems as exc:
        for path, message in exc.problems:
            if message.startswith("unknown key") and isinstance(_get_path(raw, path), dict):
                known = ", ".join(f"[{p}]" for p in sorted(section_classes)) or "none"
                message += (f"; no installed plugin registers a [{path}] section "
                            f"(plugin sections: {known})")
            problems.append((path, message))
        config = None
    if problems:
        raise Problems(problems)
    return attrs.evolve(config, sections=sections)


# Settings that name a registered implementation and, left unset, take the one its plugin declared
# the default: (table, key, registry kind).
DEFAULTED_NAMES = (("trainer", "backend", "training_backends"), ("rollout", "name", "rollout_engines"))


def with_default_names(config: JobConfig, manager) -> tuple[JobConfig, list[str]]:
    """``config`` with each unset ``DEFAULTED_NAMES`` setting filled from the plugins' declared
    defaults; the problems of those that none (or more than one) declares."""
    problems = []
    for table, key, kind in DEFAULTED_NAMES:
        section = getattr(config, table)
        if getattr(section, key) is not None:
            continue
        try:
            name = manager.registry(kind).default(f"{table}.{key}")
        except RlcoreError as exc:
            problems.append(str(exc))
            continue
        config = attrs.evolve(config, **{table: attrs.evolve(section, **{key: name})})
    return config, problems


def load_job(path: str | Path | None, overrides: list[str] = (), manager=None, check: bool = True,
             machine: bool = False) -> Job:
    """Load and validate a job. ``check=False`` skips name and cross-field checks (``config show``);
    ``machine=True`` adds the checks of files, folders and disk (``rlcore.runs.preflight``), reported in
    the same pass (``config validate`` and ``train``)."""
    manager = manager or get_manager()
    source = str(path) if path is not None else None
    raw = read_toml(path) if path is not None else {}
    file_keys = _dotted_keys(raw)

    mapping = verl_mapping(manager)
    parsed: list[Override] = [parse_override(text, mapping) for text in overrides]
    parsed, ignored, renamed, refused = translate_verl(parsed, mapping)
    problems = refused + conflicting_verl_keys(parsed) + apply_overrides(raw, parsed)
    notes = [f"verl key {o.verl_key} -> {o.key} = {o.value!r}" for o in parsed if o.verl_key] + renamed
    origin = {o.key: o.text for o in parsed}

    sections = {e.name: e.value for e in manager.registry("config_sections").entries()}
    config, set_keys = None, frozenset(file_keys | {o.key for o in parsed})
    try:
        config = build_config(raw, sections)
    except Problems as exc:
        for key, message in exc.problems:
            given = f" (from override {origin[key]!r})" if key in origin else ""
            problems.append(f"{key}: {message}{given}")
        if check:  # the rest of the job is still checked, so that one run reports every problem
            problems += _checks_without(raw, [key for key, _ in exc.problems], sections, set_keys, manager)
    if problems:
        raise ConfigError(problems, source)

    config, unresolved = with_default_names(config, manager)
    warnings: list[str] = []
    if check:
        errors, warnings = check_job(config, set_keys, manager, machine=machine)
        errors = unresolved + errors
        if errors:
            raise ConfigError(errors, source)
    return Job(config, set_keys, tuple(notes), tuple(ignored + list(warnings)), source, tuple(overrides))


def _checks_without(raw: dict, bad_keys: list[str], sections: dict[str, type], set_keys: frozenset[str],
                    manager) -> list[str]:
    """The checks' problems of the job with its unreadable keys left out (their defaults in their place),
    none of them about a key left out; nothing where the rest does not build either."""
    rest = copy.deepcopy(raw)
    for key in bad_keys:
        _pop_path(rest, key)
    try:
        config, unresolved = with_default_names(build_config(rest, sections), manager)
    except (Problems, RlcoreError):
        return []
    errors, _ = check_job(config, set_keys - set(bad_keys), manager)
    return [e for e in unresolved + errors if not any(e.startswith(key) for key in bad_keys)]
