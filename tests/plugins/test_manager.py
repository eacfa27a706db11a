import json
import types

import pytest

from rlcore import hookimpl
from rlcore.errors import DuplicateNameError, PluginError, UnknownNameError
from rlcore.plugins.manager import PluginManager
from tests.conftest import run_rlcore

BUILT_IN_PACKAGES = {"fsdp", "megatron", "vllm", "sglang", "rocm", "ascend"}


def plugin(**hooks):
    """An in-process plugin object with the given hook implementations."""
    return types.SimpleNamespace(**{name: hookimpl(fn) for name, fn in hooks.items()})


def rewards(*names):
    def rlcore_register_reward_functions(register):
        for name in names:
            register(name, lambda *a, **k: 0.0)

    return rlcore_register_reward_functions


def test_core_builtins_register_through_the_hooks():
    manager = PluginManager(autoload=False)
    assert {"cpu", "cuda"} <= set(manager.registry("platforms").names())
    assert {"plugins", "config"} <= set(manager.registry("cli_commands").names())
    assert all(p.entry_point is None for p in manager.loaded)  # only the core's own


def test_in_process_plugin_registrations_are_attributed():
    manager = PluginManager(autoload=False, plugins={"mine": plugin(rlcore_register_reward_functions=rewards("a/b"))})
    entry = manager.registry("reward_functions").entry("a/b")
    assert entry.provider.plugin == "mine"
    assert {"name": "mine", "registered": {"reward_functions": ["a/b"]}}.items() <= next(
        p for p in manager.describe()["plugins"] if p["name"] == "mine").items()


def test_hook_may_take_no_arguments():
    manager = PluginManager(autoload=False, plugins={"quiet": plugin(rlcore_register_loggers=lambda: None)})
    assert [p.provider.plugin for p in manager.loaded][-1] == "quiet"


def test_duplicate_names_across_plugins_name_both():
    with pytest.raises(DuplicateNameError, match="plugin 'first'.*plugin 'second'"):
        PluginManager(autoload=False, plugins={
            "first": plugin(rlcore_register_reward_functions=rewards("x/y")),
            "second": plugin(rlcore_register_reward_functions=rewards("x/y")),
        })


def test_misspelled_hook_is_reported_and_others_keep_working():
    typo = types.SimpleNamespace(rlcore_register_reward_fns=hookimpl(lambda register: None))
    manager = PluginManager(autoload=False, plugins={
        "typo": typo, "good": plugin(rlcore_register_reward_functions=rewards("ok/1")),
    })
    (failed,) = manager.failed
    assert failed.provider.plugin == "typo" and "rlcore_register_reward_fns" in failed.error
    assert "ok/1" in manager.registry("reward_functions")
    assert "typo" not in {p.provider.plugin for p in manager.loaded}


def test_hook_that_raises_is_reported_and_registers_nothing():
    def rlcore_register_reward_functions(register):
        register("half/done", len)
        raise RuntimeError("database unreachable")

    manager = PluginManager(autoload=False, plugins={
        "flaky": plugin(rlcore_register_reward_functions=rlcore_register_reward_functions),
        "good": plugin(rlcore_register_reward_functions=rewards("ok/1")),
    })
    assert "RuntimeError: database unreachable" in manager.failed[0].error
    assert "half/done" not in manager.registry("reward_functions")
    with pytest.raises(UnknownNameError, match="flaky.*database unreachable"):
        manager.get("reward_functions", "half/done")


def test_entry_points_of_built_in_packages_are_loaded(monkeypatch):
    monkeypatch.delenv("RLCORE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("RLCORE_PLUGINS", raising=False)
    manager = PluginManager()
    loaded = {p.provider.plugin: p for p in manager.loaded}
    assert BUILT_IN_PACKAGES <= set(loaded)
    assert loaded["fsdp"].provider.distribution == "rlcore"
    assert loaded["fsdp"].entry_point == "fsdp = rlcore_fsdp"


def test_disable_autoload_keeps_only_the_core(monkeypatch):
    monkeypatch.setenv("RLCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    manager = PluginManager()
    assert not BUILT_IN_PACKAGES & {p.provider.plugin for p in manager.loaded}
    assert "cpu" in manager.registry("platforms")


def test_rlcore_plugins_selects_entry_points(monkeypatch):
    monkeypatch.setenv("RLCORE_PLUGINS", "fsdp,vllm")
    names = {p.provider.plugin for p in PluginManager().loaded if p.entry_point}
    assert names == {"fsdp", "vllm"}


def test_rlcore_plugins_with_unknown_name_is_an_error(monkeypatch):
    monkeypatch.setenv("RLCORE_PLUGINS", "fsdpp")
    with pytest.raises(PluginError, match='fsdpp.*did you mean "fsdp"'):
        PluginManager()


# -- installed packages (pip --target into a temporary directory) --------------------------------

def test_installed_example_plugin_is_discovered(plugin_site):
    result = run_rlcore("plugins", "--json", site=plugin_site)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    example = next(p for p in info["plugins"] if p["name"] == "example")
    assert example["distribution"] == "rlcore-example"
    assert "example/target_length" in example["registered"]["reward_functions"]
    assert BUILT_IN_PACKAGES <= {p["name"] for p in info["plugins"]}


def test_broken_plugin_is_shown_with_reason_and_others_still_listed(plugin_site):
    result = run_rlcore("plugins", site=plugin_site)
    assert result.returncode == 0, result.stderr
    assert "broken (rlcore-broken-example 0.0.1, entry point broken = rlcore_broken) FAILED TO LOAD" in result.stdout
    assert "libdoesnotexist" in result.stdout
    assert "example (rlcore-example 0.1.0" in result.stdout


def test_asking_for_a_name_of_a_broken_plugin_names_its_distribution(plugin_site):
    result = run_rlcore("config", "validate", "algorithm.adv_estimator=broken_thing", site=plugin_site)
    assert result.returncode == 2
    assert "rlcore-broken-example" in result.stderr and "libdoesnotexist" in result.stderr
    assert "Traceback" not in result.stderr


def test_disable_autoload_hides_installed_plugins(plugin_site):
    result = run_rlcore("plugins", "--json", site=plugin_site, env={"RLCORE_DISABLE_PLUGIN_AUTOLOAD": "1"})
    info = json.loads(result.stdout)
    assert [p["entry_point"] for p in info["plugins"]] == [None] * len(info["plugins"])
    assert info["failed"] == []
