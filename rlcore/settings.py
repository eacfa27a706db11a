"""``setting()``: an attrs field with the range and documentation the config loader checks and shows.

The floor of the configuration: each component's table (``rlcore/rewards/config.py``, ...) is built
from it, and ``rlcore.config`` assembles those tables into ``JobConfig``; it imports nothing of rlcore."""

import attrs

_MISSING = attrs.NOTHING


def setting(
    default=_MISSING,
    *,
    factory=None,
    doc: str = "",
    ge=None,
    gt=None,
    le=None,
    lt=None,
    choices: tuple | None = None,
):
    """A config field. Ranges (``ge``/``gt``/``le``/``lt``) and ``choices`` are checked on load."""
    metadata = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices}
    if factory is not None:
        return attrs.field(factory=factory, metadata=metadata)
    return attrs.field(default=default, metadata=metadata)


def range_problem(field: attrs.Attribute, value) -> str | None:
    """Why ``value`` is out of the field's range, or None when it is fine."""
    meta = field.metadata
    if value is None:
        return None
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        return f"expected one of {', '.join(repr(c) for c in choices)}, got {value!r}"
    checks = (("ge", ">=", lambda v, b: v >= b), ("gt", ">", lambda v, b: v > b),
              ("le", "<=", lambda v, b: v <= b), ("lt", "<", lambda v, b: v < b))
    for key, symbol, ok in checks:
        bound = meta.get(key)
        if bound is not None and isinstance(value, (int, float)) and not ok(value, bound):
            return f"must be {symbol} {bound}, got {value!r}"
    return None
