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


# --- a component's checks of a whole job ------------------------------------------------------------


@attrs.frozen
class CheckedJob:
    """What a job check reads: the job's ``config`` (a ``JobConfig``), the keys its file and
    overrides set, and the plugin ``manager`` whose registries resolve its names."""

    config: object
    set_keys: frozenset[str]
    manager: object

    def given(self, prefix: str) -> list[str]:
        """The keys the job set at or under ``prefix`` ("critic" gives "critic.optim.lr", ...), sorted."""
        return sorted(k for k in self.set_keys if k == prefix or k.startswith(prefix + "."))

    @property
    def tables(self) -> frozenset[str]:
        """The set keys that are tables ("critic.optim" for a [critic.optim] table with keys of its own)."""
        return frozenset(k for k in self.set_keys if any(other.startswith(k + ".") for other in self.set_keys))


@attrs.frozen
class JobCheck:
    """A component's checks of whole jobs, registered by name with ``rlcore_register_job_checks``.

    ``problems(job)`` returns errors and ``unused(job)`` warnings for settings that have no effect given
    the others, each message naming its key and what is expected (``job``: a ``CheckedJob``).
    ``machine = True`` marks checks of this machine (files, folders, disk, libraries), which
    ``rlcore config validate`` and ``rlcore train`` run and ``config show`` does not."""

    problems: object = None  # Callable[[CheckedJob], list[str]] | None
    unused: object = None  # Callable[[CheckedJob], list[str]] | None
    machine: bool = False

    def __attrs_post_init__(self):
        if self.problems is None and self.unused is None:
            raise TypeError("JobCheck needs problems= or unused= (or both)")
