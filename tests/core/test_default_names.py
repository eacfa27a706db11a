"""The core's schema names no default backend or engine: plugins declare theirs when they register."""

from __future__ import annotations

import pytest

from rlcore.api import hookimpl
from rlcore.config import load_job
from rlcore.config.schema import JobConfig
from rlcore.errors import ConfigError
from rlcore.plugins.manager import PluginManager

BASE = ["data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=2"]


class SecondDefaults:
    """A third party that also declares itself the default backend and engine."""

    @hookimpl
    def rlcore_register_training_backends(self, register):
        from rlcore_fsdp.backend import FsdpBackend

        register("other-backend", FsdpBackend(), default=True)

    @hookimpl
    def rlcore_register_rollout_engines(self, register):
        from rlcore.api import RolloutEngine
        from rlcore.rollout.hf import HfRollout

        register("other-engine", RolloutEngine(HfRollout), default=True)


def test_the_schema_leaves_backend_and_engine_unset():
    config = JobConfig()
    assert config.trainer.backend is None and config.rollout.name is None


def test_the_installed_plugins_declare_fsdp_and_hf_the_defaults():
    manager = PluginManager()
    assert [e.name for e in manager.registry("training_backends").entries() if e.default] == ["fsdp"]
    assert [e.name for e in manager.registry("rollout_engines").entries() if e.default] == ["hf"]
    config = load_job(None, BASE, manager=manager).config
    assert (config.trainer.backend, config.rollout.name) == ("fsdp", "hf")
    shown = {p["name"]: p["defaults"] for p in manager.describe()["plugins"]}  # what `rlcore plugins` prints
    assert shown["fsdp"] == {"training_backends": "fsdp"} and shown["rlcore.rollout.plugin"] == {"rollout_engines": "hf"}
    assert shown["megatron"] == {}


def test_two_declared_defaults_name_both_plugins_unless_the_job_chooses():
    manager = PluginManager(plugins={"second": SecondDefaults()})
    with pytest.raises(ConfigError) as info:
        load_job(None, BASE, manager=manager)
    backend, engine = info.value.problems
    assert backend.startswith("trainer.backend is not set and more than one plugin declares a default for it: ")
    assert "'fsdp' by plugin 'fsdp'" in backend and "'other-backend' by plugin 'second'" in backend
    assert "'hf' by plugin 'rlcore.rollout.plugin'" in engine and "'other-engine' by plugin 'second'" in engine
    chosen = load_job(None, [*BASE, "trainer.backend=other-backend", "rollout.name=hf"], manager=manager).config
    assert (chosen.trainer.backend, chosen.rollout.name) == ("other-backend", "hf")


def test_without_a_backend_plugin_the_job_is_told_to_name_one():
    with pytest.raises(ConfigError) as info:
        load_job(None, BASE, manager=PluginManager(autoload=False))
    (problem,) = [p for p in info.value.problems if p.startswith("trainer.backend")]
    assert problem == ("trainer.backend is not set and no installed plugin declares a default for it: set "
                       "trainer.backend (registered training_backends: (none))")
