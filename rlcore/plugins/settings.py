"""What a component declares about its configuration: its settings (``setting()``, an attrs field
with the range and documentation the config loader checks and shows), its checks of a whole job
(``JobCheck``) and how verl's keys map onto its settings (``VerlKeys``).

The floor of the configuration: each component's table (``rlcore/rewards/config.py``, ...) is built
from it, and ``rlcore.config`` assembles those tables into ``JobConfig``; it imports nothing of rlcore."""

from typing import Any

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


# --- how verl's keys map onto a component's settings ------------------------------------------------


@attrs.frozen
class Ignore:
    """A verl key rlcore ignores, with a warning naming its category (``rlcore.config.verl_keys.CATEGORIES``)."""

    category: str
    why: str


@attrs.frozen
class Refuse:
    instead: str  # what to use instead, said to the user
    unless: tuple = ()  # values that ask for what rlcore does anyway: accepted (category "as-rlcore")
    # True: the values in ``unless`` (after the value map, ``VerlKeys.values``) are set on the key's
    # rlcore setting (its alias) rather than dropped as what rlcore does anyway
    mapped: bool = False


# (glob patterns on the verl key, what to do: Ignore, Refuse, or None: the key is mapped)
Rule = tuple[tuple[str, ...], "Ignore | Refuse | None"]


@attrs.frozen
class VerlTable:
    """A verl table translated as a whole: every verl key under ``prefix`` (ending in ".") is taken
    out of the overrides, and ``translate({key under the prefix: value})`` returns the rlcore
    settings they mean ({rlcore key: value}; a ValueError names the verl key that cannot be taken).
    ``how`` says what becomes of them, for ``verl_disposition``."""

    prefix: str
    how: str
    translate: Any  # Callable[[dict[str, Any]], dict[str, Any]]


@attrs.frozen
class VerlKeys:
    """How verl's keys and values map onto a plugin's own settings, registered with
    ``rlcore_register_verl_keys`` so the core's mapping needs no entry naming a plugin."""

    # (verl key, or prefix ending in "."; rlcore key, or prefix): ("critic.model.turbo_config.", "critic.turbo.")
    aliases: tuple[tuple[str, str], ...] = ()
    # rlcore key -> {verl's value: rlcore's}, for values verl spells differently: {"trainer.backend": {"turbo2": "turbo"}}
    values: dict[str, dict[Any, Any]] = attrs.field(factory=dict)
    # what the plugin does with the verl keys of its tables that no setting takes: (glob patterns,
    # VerlIgnore(category, why) or VerlRefuse(instead, accepted values) or None: mapped), tried in
    # order before the core's rules (rlcore.config.verl_keys)
    rules: tuple[Rule, ...] = ()
    # verl's trainer config name (a launch script's --config-name, without ".yaml") -> the rlcore
    # settings it implies, as override values: {"turbo_trainer": {"trainer.backend": "turbo"}}
    config_names: dict[str, dict[str, str]] = attrs.field(factory=dict)
    # verl tables whose keys translate together, not one by one (a VerlTable each)
    tables: tuple[VerlTable, ...] = ()
