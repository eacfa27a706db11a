"""Name -> implementation tables, one per kind, that fail loudly on duplicates and unknown names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from rlcore.errors import DuplicateNameError, UnknownNameError, did_you_mean


@attrs.frozen
class Provider:
    """Who registered something: a plugin and the distribution that installed it."""

    plugin: str
    distribution: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        if self.distribution is None:
            return f"plugin {self.plugin!r}"
        return f"plugin {self.plugin!r} (distribution {self.distribution} {self.version})"


@attrs.frozen
class Entry:
    name: str
    value: Any
    provider: Provider
    default: bool = False  # the plugin declared it the default of its kind (``register(..., default=True)``)


@attrs.frozen
class FailedPlugin:
    """A plugin that could not be loaded; kept so errors and ``rlcore plugins`` can name it."""

    provider: Provider
    entry_point: str
    error: str


class Registry:
    """Registered implementations of one kind (e.g. ``advantage_estimators``)."""

    def __init__(self, kind: str, failed: list[FailedPlugin] | None = None):
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        self._failed = failed if failed is not None else []

    def add(self, name: str, value: Any, provider: Provider, *, default: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise DuplicateNameError(
                f"{provider} registered a {self.kind} entry with an invalid name {name!r}: "
                "names are non-empty strings"
            )
        if name in self._entries:
            first = self._entries[name].provider
            raise DuplicateNameError(
                f"{self.kind} name {name!r} is registered twice: by {first} and by {provider}. "
                "Uninstall one of them or limit the plugins loaded with RLCORE_PLUGINS."
            )
        self._entries[name] = Entry(name, value, provider, default)

    def get(self, name: str) -> Any:
        return self.entry(name).value

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self._unknown_message(name)) from None

    def _unknown_message(self, name: str) -> str:
        known = ", ".join(sorted(self._entries)) or "(none)"
        message = f"unknown {self.kind} name {name!r}{did_you_mean(name, self._entries)}; registered: {known}."
        for failed in self._failed:
            message += (
                f"\n  {failed.provider} (entry point {failed.entry_point}) failed to load and may "
                f"provide it: {failed.error}"
            )
        return message

    def default(self, setting: str) -> str:
        """The name of the one entry its plugin declared the default, for a job that leaves
        ``setting`` unset; an error when no installed plugin declares one, or more than one does."""
        defaults = [e for e in self.entries() if e.default]
        if len(defaults) == 1:
            return defaults[0].name
        if not defaults:
            known = ", ".join(self.names()) or "(none)"
            raise UnknownNameError(f"{setting} is not set and no installed plugin declares a default for it: "
                                   f"set {setting} (registered {self.kind}: {known})")
        claims = " and ".join(f"{e.name!r} by {e.provider}" for e in defaults)
        raise DuplicateNameError(f"{setting} is not set and more than one plugin declares a default for it: "
                                 f"{claims}; set {setting}")

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        return [self._entries[n] for n in sorted(self._entries)]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
