"""The one plugin manager: the core's built-ins and entry points of group ``rlcore``, through the same hooks.

``RLCORE_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry points; ``RLCORE_PLUGINS=a,b`` loads only those
entry points. A plugin that fails to import or to register is recorded with its entry point,
distribution and exception, and the others keep working.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
from importlib import metadata
from types import ModuleType
from typing import Any

import attrs
import pluggy

import rlcore
from rlcore.errors import PluginError, describe_exit, did_you_mean
from rlcore.plugins import hookspecs
from rlcore.plugins.registry import FailedPlugin, Provider, Registry

ENTRY_POINT_GROUP = "rlcore"
CORE_PLUGIN_MODULES = ("rlcore.builtins", "rlcore.algorithms.plugin", "rlcore.data.plugin", "rlcore.rewards.plugin", "rlcore.rollout.plugin",
                       "rlcore.tools.plugin", "rlcore.asynchronous.plugin", "rlcore.agents.plugin",
                       "rlcore.profiling.plugin")


@attrs.frozen
class LoadedPlugin:
    provider: Provider
    entry_point: str | None
    registered: dict[str, list[str]]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return describe_exit(exc)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


class PluginManager:
    """Loads plugins and fills one ``Registry`` per kind from their hook implementations."""

    def __init__(
        self,
        autoload: bool | None = None,
        only: list[str] | None = None,
        plugins: dict[str, Any] | None = None,
    ):
        """``plugins``: extra in-process plugin objects by name, loaded after the entry points."""
        if autoload is None:
            autoload = os.environ.get("RLCORE_DISABLE_PLUGIN_AUTOLOAD", "") not in ("1", "true", "yes")
        if only is None and os.environ.get("RLCORE_PLUGINS"):
            only = [n.strip() for n in os.environ["RLCORE_PLUGINS"].split(",") if n.strip()]
        self._pm = pluggy.PluginManager("rlcore")
        self._pm.add_hookspecs(hookspecs)
        self._providers: dict[str, Provider] = {}
        self._entry_points: dict[str, str | None] = {}
        self.failed: list[FailedPlugin] = []
        self.loaded: list[LoadedPlugin] = []
        self.registries = {kind: Registry(kind, self.failed) for kind in hookspecs.KINDS.values()}

        # What plugins print while they load goes to stderr: stdout belongs to the command
        # (``rlcore plugins --json``, ``rlcore config show``).
        with contextlib.redirect_stdout(sys.stderr):
            for module_name in CORE_PLUGIN_MODULES:
                core = Provider(module_name, "rlcore", rlcore.__version__)
                self._add(importlib.import_module(module_name), core, entry_point=None)
            if autoload:
                self._load_entry_points(only)
            for name, plugin in (plugins or {}).items():
                self._add(plugin, Provider(name, "(in-process)", "-"), entry_point=f"{name} (in-process)")
            for name in list(self._providers):  # the core first, then entry points by name
                self._collect(self._pm.get_plugin(name))

    # -- loading ---------------------------------------------------------------------------------
    def _load_entry_points(self, only: list[str] | None) -> None:
        entry_points = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
        if only is not None:
            available = {ep.name for ep in entry_points}
            missing = [n for n in only if n not in available]
            if missing:
                raise PluginError(
                    f"RLCORE_PLUGINS names {', '.join(missing)}, which no installed package provides"
                    f"{did_you_mean(missing[0], available)}; installed plugins: {', '.join(sorted(available))}"
                )
            entry_points = [ep for ep in entry_points if ep.name in only]
        seen: set[str] = set()
        for ep in entry_points:
            if ep.name in seen:  # the same distribution found twice on sys.path
                continue
            seen.add(ep.name)
            dist = ep.dist
            provider = Provider(ep.name, dist.name if dist else "?", dist.version if dist else "?")
            label = f"{ep.name} = {ep.value}"
            try:
                plugin = ep.load()
            # SystemExit too: a plugin that exits on import is a broken plugin, not the end of every command.
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - any import failure is reported, not raised
                self.failed.append(FailedPlugin(provider, label, _describe(exc)))
                continue
            self._add(plugin, provider, label)

    def _add(self, plugin: ModuleType | Any, provider: Provider, entry_point: str | None) -> None:
        try:
            self._pm.register(plugin, name=provider.plugin)
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self._pm.unregister(name=provider.plugin)
            if entry_point is None:
                raise
            self.failed.append(FailedPlugin(provider, entry_point, _describe(exc)))
            return
        except ValueError as exc:  # pluggy: a plugin of that name is already registered
            self.failed.append(FailedPlugin(provider, entry_point or provider.plugin, _describe(exc)))
            return
        self._providers[provider.plugin] = provider
        self._entry_points[provider.plugin] = entry_point

    def _collect(self, plugin: Any) -> None:
        """Run one plugin's hooks; commit what it registered only if every hook succeeded."""
        name = self._pm.get_name(plugin)
        provider = self._providers[name]
        pending: list[tuple[str, str, Any, bool]] = []
        for hook_name, kind in hookspecs.KINDS.items():
            for impl in getattr(self._pm.hook, hook_name).get_hookimpls():
                if impl.plugin is not plugin:
                    continue

                def register(item_name: str, value: Any, _kind: str = kind, *, default: bool = False) -> None:
                    pending.append((_kind, item_name, value, default))

                kwargs = {"register": register} if "register" in impl.argnames else {}
                try:
                    impl.function(**kwargs)
                except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported with the plugin's name
                    entry_point = self._entry_points[name]
                    if entry_point is None:
                        raise  # the core's own built-ins must never fail
                    self.failed.append(FailedPlugin(provider, entry_point, _describe(exc)))
                    return
        registered: dict[str, list[str]] = {}
        for kind, item_name, value, default in pending:
            self.registries[kind].add(item_name, value, provider, default=default)
            registered.setdefault(kind, []).append(item_name)
        self.loaded.append(LoadedPlugin(provider, self._entry_points[name], registered))

    # -- lookup ----------------------------------------------------------------------------------
    def registry(self, kind: str) -> Registry:
        return self.registries[kind]

    def get(self, kind: str, name: str) -> Any:
        return self.registries[kind].get(name)

    def describe(self) -> dict[str, Any]:
        """Everything ``rlcore plugins`` shows, as plain data."""
        return {
            "plugins": [
                {
                    "name": p.provider.plugin,
                    "distribution": p.provider.distribution,
                    "version": p.provider.version,
                    "entry_point": p.entry_point,
                    "registered": {k: sorted(v) for k, v in sorted(p.registered.items())},
                    # the names it declared the default of their kind (for a job that names none)
                    "defaults": {k: n for k, names in sorted(p.registered.items()) for n in names
                                 if self.registries[k].entry(n).default},
                }
                for p in self.loaded
            ],
            "failed": [
                {
                    "name": f.provider.plugin,
                    "distribution": f.provider.distribution,
                    "version": f.provider.version,
                    "entry_point": f.entry_point,
                    "error": f.error,
                }
                for f in self.failed
            ],
        }


_manager: PluginManager | None = None


def get_manager() -> PluginManager:
    """The process-wide plugin manager, built on first use."""
    global _manager
    if _manager is None:
        _manager = PluginManager()
    return _manager


def reset_manager() -> None:
    """Forget the process-wide manager (tests, or after installing a plugin at run time)."""
    global _manager
    _manager = None
