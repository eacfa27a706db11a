"""Strict structuring of TOML data into the attrs config classes, collecting every problem.

cattrs' default hooks are lenient (10.7 -> 10, "false" -> True); these are not: an int field takes
only an integer, a float field an integer or a float, a bool field only true/false, a string field
only a string. Every problem is reported with its TOML path, what was expected and what was given.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

import attrs
import cattrs

from rlcore.errors import did_you_mean
from rlcore.plugins.settings import range_problem


class Problems(Exception):
    """Problems found while structuring, as (relative path, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__(problems)
        self.problems = problems


def _join(prefix: str, path: str) -> str:
    if not path:
        return prefix
    return f"{prefix}{path}" if path.startswith("[") else f"{prefix}.{path}"


def describe_value(value: Any) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
             list: "an array", dict: "a table"}
    return f"{kinds.get(type(value), type(value).__name__)} {value!r}"


def describe_type(tp: Any) -> str:
    names = {bool: "a boolean (true or false)", int: "an integer", float: "a number", str: "a string"}
    if tp in names:
        return names[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or (origin is not None and type(None) in args):
        inner = [describe_type(a) for a in args if a is not type(None)]
        return " or ".join(inner)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return f"an array of {describe_type(args[0]).split(' (')[0].removeprefix('a ').removeprefix('an ')}s"
    if origin is tuple:
        return f"an array of {len(args)} numbers" if all(a is float for a in args) else f"an array of {len(args)}"
    if attrs.has(tp):
        return "a table"
    return str(tp)


def _expect(tp: Any, ok: bool, value: Any) -> Any:
    if not ok:
        raise Problems([("", f"expected {describe_type(tp)}, got {describe_value(value)}")])
    return value


INT64 = (-(2**63), 2**63 - 1)


def _integer(value: Any) -> int:
    _expect(int, type(value) is int, value)
    # TOML's integers are 64-bit, but Python's reader takes any size; torch and numpy do not.
    if not INT64[0] <= value <= INT64[1]:
        raise Problems([("", f"expected a 64-bit integer (-2**63 to 2**63 - 1), got {value}")])
    return value


def _finite_float(value: Any) -> float:
    _expect(float, type(value) in (int, float), value)
    # TOML has inf and nan literals; no setting means them, and one would poison every weight.
    if not math.isfinite(value):
        raise Problems([("", f"expected a finite number, got {value!r}")])
    return float(value)


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(detailed_validation=False, forbid_extra_keys=True)
    converter.register_structure_hook(bool, lambda v, t: _expect(bool, type(v) is bool, v))
    converter.register_structure_hook(int, lambda v, t: _integer(v))
    converter.register_structure_hook(str, lambda v, t: _expect(str, type(v) is str, v))
    converter.register_structure_hook(float, lambda v, t: _finite_float(v))
    converter.register_structure_hook_factory(
        lambda t: typing.get_origin(t) is tuple, lambda t: _tuple_hook(converter, t))
    converter.register_structure_hook_factory(attrs.has, lambda cls: _attrs_hook(converter, cls))
    converter.register_structure_hook_factory(_text_or_texts, lambda t: lambda v, _: _text_or_texts_value(v, t))
    return converter


def _text_or_texts(tp: Any) -> bool:
    """``str | tuple[str, ...]`` (or unset): a command line as one string or as its words."""
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and \
        {a for a in typing.get_args(tp) if a is not type(None)} == {str, tuple[str, ...]}


def _text_or_texts_value(value: Any, tp: Any) -> str | tuple[str, ...] | None:
    if value is None and type(None) in typing.get_args(tp):
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise Problems([("", f"expected a string or an array of strings, got {describe_value(value)}")])


def _tuple_hook(converter: cattrs.Converter, tp: Any):
    args = typing.get_args(tp)
    homogeneous = len(args) == 2 and args[1] is Ellipsis

    def hook(value: Any, _: Any) -> tuple:
        if homogeneous and isinstance(value, str):
            value = [value]  # a single string where a list of strings is expected
        if not isinstance(value, (list, tuple)):
            raise Problems([("", f"expected {describe_type(tp)}, got {describe_value(value)}")])
        if not homogeneous and len(value) != len(args):
            raise Problems([("", f"expected {describe_type(tp)}, got {len(value)} items {value!r}")])
        problems, items = [], []
        for index, item in enumerate(value):
            item_type = args[0] if homogeneous else args[index]
            try:
                items.append(converter.structure(item, item_type))
            except Problems as exc:
                problems += [(_join(f"[{index}]", p), m) for p, m in exc.problems]
        if problems:
            raise Problems(problems)
        return tuple(items)

    return hook


def _attrs_hook(converter: cattrs.Converter, cls: type):
    fields = attrs.fields(cls)
    hints = typing.get_type_hints(cls)
    fields = [f for f in fields if f.init and not f.metadata.get("internal")]
    names = [f.name for f in fields]

    def hook(data: Any, _: Any) -> Any:
        if not isinstance(data, dict):
            raise Problems([("", f"expected a table, got {describe_value(data)}")])
        problems: list[tuple[str, str]] = []
        for key in data:
            if key not in names:
                problems.append((key, f"unknown key{did_you_mean(key, names)}"))
        kwargs = {}
        for field in fields:
            if field.name not in data:
                continue
            try:
                value = converter.structure(data[field.name], hints[field.name])
            except Problems as exc:
                problems += [(_join(field.name, p), m) for p, m in exc.problems]
                continue
            problem = range_problem(field, value)
            if problem:
                problems.append((field.name, problem))
                continue
            kwargs[field.name] = value
        if problems:
            raise Problems(problems)
        return cls(**kwargs)

    return hook


_converter = make_converter()


def structure(data: Any, cls: type) -> Any:
    """Structure ``data`` into ``cls``; raises ``Problems`` listing every problem found."""
    try:
        return _converter.structure(data, cls)
    except Problems:
        raise
    except Exception as exc:  # noqa: BLE001 - an unexpected shape is still a config problem
        raise Problems([("", f"could not read this value: {exc}")]) from exc
