"""Write a resolved ``JobConfig`` back out as TOML, defaults included (``rlcore config show``)."""

from __future__ import annotations

from typing import Any

import attrs
import tomli_w


def _literal(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, dict):  # free-form options (an engine section's engine_kwargs): an inline table
        return "{" + ", ".join(f"{_key(k)} = {_literal(v)}" for k, v in value.items()) + "}"
    return tomli_w.dumps({"v": value}).strip()[len("v = "):]


def _key(key: str) -> str:
    return tomli_w.dumps({key: 0}).strip()[:-len(" = 0")]


def _table(obj: Any, path: str, lines: list[str]) -> None:
    scalars, tables = [], []
    for field in attrs.fields(type(obj)):
        if field.metadata.get("internal"):
            continue
        value = getattr(obj, field.name)
        (tables if attrs.has(type(value)) else scalars).append((field, value))
    if path:
        lines.append(f"\n[{path}]")
    for field, value in scalars:
        doc = field.metadata.get("doc")
        comment = f"  # {doc}" if doc else ""
        if value is None:
            lines.append(f"# {field.name} is unset{comment}")
        else:
            lines.append(f"{field.name} = {_literal(value)}{comment}")
    for field, value in tables:
        _table(value, f"{path}.{field.name}" if path else field.name, lines)


def to_toml(config: Any) -> str:
    """TOML text that loads back into an equal config."""
    lines: list[str] = []
    _table(config, "", lines)
    for path, section in sorted(getattr(config, "sections", {}).items()):
        _table(section, path, lines)
    return "\n".join(lines).lstrip("\n") + "\n"
