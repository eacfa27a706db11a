"""The training-backend contract: declared capabilities, read one way; algorithms resolved by the driver."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from rlcore.api import ActorAlgorithms, RolloutEngine, TrainingBackend, hookimpl
from rlcore.config import load_job
from rlcore.errors import ConfigError, RlcoreError
from rlcore.plugins.manager import PluginManager
from rlcore.training.backends import resolve_actor_algorithms, training_backend
from rlcore.workers.plan import plan_roles

BASE = ["data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=2"]


class Built:
    """What the test backend's builders return: the call they answer."""

    def __init__(self, role, spec):
        self.role, self.spec = role, spec


class SplittingBackend(TrainingBackend):
    """A backend declaring a layout and nothing else: no LoRA, no export."""

    name = "splitting"

    def actor(self, spec, platform):
        return Built("actor", spec)

    def reference(self, spec, platform):
        return Built("reference", spec)

    def critic(self, spec, platform):
        return Built("critic", spec)

    def describe_layout(self, spec, workers):
        return f"split in {workers * 2} halves"


class DuckTypedBackend:
    """The shape backends had before the contract: builders, but no ``TrainingBackend`` base."""

    def actor(self, config, platform):
        return None


def plain_engine(config, platform, actor):
    """An engine factory that declares nothing: it does not return the experts it chose."""
    raise AssertionError("the config checks never build an engine")


class BackendsPlugin:
    @hookimpl
    def rlcore_register_training_backends(self, register):
        register("splitting", SplittingBackend())
        register("duck", DuckTypedBackend())

    @hookimpl
    def rlcore_register_rollout_engines(self, register):
        register("plain", RolloutEngine(plain_engine))


@pytest.fixture(scope="module")
def manager():
    return PluginManager(plugins={"backends": BackendsPlugin()})


def test_capabilities_are_declared_with_defaults():
    backend = SplittingBackend()
    assert backend.supports_lora is False and backend.export_command is None and backend.requires == ()
    assert TrainingBackend.describe_layout(backend, None, 1) is None
    with pytest.raises(TypeError, match="abstract"):
        type("Incomplete", (TrainingBackend,), {"actor": lambda self, spec, p: None})()


def test_the_built_in_backends_subclass_the_contract(manager):
    fsdp = training_backend(manager, "fsdp")
    assert isinstance(fsdp, TrainingBackend) and fsdp.supports_lora
    assert "{checkpoint}" in fsdp.export_command


def test_a_registered_object_without_the_base_class_is_named_with_its_plugin(manager):
    with pytest.raises(RlcoreError, match=r"training backend 'duck' registered by plugin 'backends'.*"
                                          r"DuckTypedBackend.*TrainingBackend subclass"):
        training_backend(manager, "duck")


def test_the_driver_resolves_the_actors_algorithms_from_the_registries(manager):
    config = load_job(None, [*BASE, "actor.policy_loss=gspo", "actor.use_kl_loss=true",
                             "actor.kl_loss_type=k3"], manager=manager).config
    algorithms = resolve_actor_algorithms(config, manager)
    assert algorithms.policy_loss is manager.get("policy_losses", "gspo")
    assert algorithms.kl_estimator is manager.get("kl_estimators", "k3")
    without_kl = load_job(None, BASE, manager=manager).config
    assert resolve_actor_algorithms(without_kl, manager).kl_estimator is None


def test_the_role_plan_carries_the_algorithms_and_the_declared_layout(manager):
    config = load_job(None, [*BASE, "trainer.backend=splitting", "trainer.n_gpus_per_node=4"],
                      manager=manager).config
    plan = plan_roles(config, manager)
    assert "actor: splitting backend" in plan.describe() and "split in 8 halves" in plan.describe()
    assert plan.actor_algorithms == ActorAlgorithms(manager.get("policy_losses", "vanilla"), None)
    built = training_backend(manager, "splitting").actor(plan.specs.actor, None)
    assert built.spec.algorithms.policy_loss is manager.get("policy_losses", "vanilla")


def test_lora_on_a_backend_that_does_not_declare_it_names_the_ones_that_do(manager):
    with pytest.raises(ConfigError) as info:
        load_job(None, [*BASE, "trainer.backend=splitting", "model.lora_rank=8"], manager=manager)
    (problem,) = [p for p in info.value.problems if "lora" in p]
    assert "model.lora_rank = 8: the 'splitting' training backend does not train LoRA adapters" in problem
    assert "one of 'fsdp'" in problem and "'splitting'" not in problem.split("one of")[1]


def test_the_sum_of_squared_probabilities_on_a_backend_that_does_not_declare_it_names_the_ones_that_do(manager):
    with pytest.raises(ConfigError) as info:
        load_job(None, [*BASE, "trainer.backend=splitting", "actor.calculate_sum_pi_squared=true"], manager=manager)
    assert ("actor.calculate_sum_pi_squared: the 'splitting' training backend does not compute it; use "
            "trainer.backend = one of 'fsdp'") in info.value.problems


def test_router_replay_on_a_backend_that_does_not_replay_routing_says_what_to_do(manager):
    with pytest.raises(ConfigError) as info:
        load_job(None, [*BASE, "trainer.backend=splitting", "actor.router_replay=R2"], manager=manager)
    (problem,) = [p for p in info.value.problems if "router_replay" in p]
    assert problem.startswith("actor.router_replay = 'R2': the 'splitting' training backend does not replay a "
                              "mixture of experts' routing;")
    assert problem.endswith("or set actor.router_replay = 'off'")


def test_router_replay_r3_needs_the_engines_choices_and_r2_needs_the_old_log_prob_pass(manager):
    with pytest.raises(ConfigError) as info:
        load_job(None, [*BASE, "actor.router_replay=R3"], manager=manager)
    assert any("set rollout.return_routed_experts = true" in p for p in info.value.problems)
    with pytest.raises(ConfigError) as info:
        load_job(None, [*BASE, "actor.router_replay=R2", "algorithm.rollout_bypass=true",
                        "algorithm.rollout_is_threshold=2.0"], manager=manager)
    assert any("bypass mode (algorithm.rollout_bypass) skips" in p for p in info.value.problems)


def test_routed_experts_from_an_engine_that_does_not_return_them_is_refused(manager):
    with pytest.raises(ConfigError) as info:
        load_job(None, [*BASE, "rollout.name=plain", "rollout.return_routed_experts=true"], manager=manager)
    (problem,) = [p for p in info.value.problems if p.startswith("rollout.return_routed_experts")]
    assert problem.startswith("rollout.return_routed_experts: the 'plain' rollout engine does not return the "
                              "experts it chose; use rollout.name = one of ")
    assert "'hf'" in problem  # the built-in engine records its routers' choices (rlcore.rollout.hf)


def test_r3_with_the_hf_engine_on_the_fsdp_backend_validates(manager):
    config = load_job(None, [*BASE, "rollout.name=hf", "actor.router_replay=R3", "rollout.return_routed_experts=true"],
                      manager=manager).config
    assert config.actor.router_replay == "R3" and config.rollout.return_routed_experts


def test_a_misspelled_engine_capability_fails_its_plugins_registration_naming_it():
    class Misspelled:
        @hookimpl
        def rlcore_register_rollout_engines(self, register):
            register("typo", RolloutEngine(plain_engine, returns_routed_expert=True))  # not returns_routed_experts

    manager = PluginManager(plugins={"misspelled": Misspelled()})
    (failed,) = [f for f in manager.failed if f.provider.plugin == "misspelled"]
    assert "returns_routed_expert" in failed.error and "typo" not in manager.registry("rollout_engines")


def test_an_engine_registered_as_a_bare_factory_is_refused_naming_its_plugin():
    from rlcore.errors import RlcoreError
    from rlcore.rollout.declared import rollout_engine

    class Bare:
        @hookimpl
        def rlcore_register_rollout_engines(self, register):
            register("bare", plain_engine)

    manager = PluginManager(plugins={"bare": Bare()})
    with pytest.raises(RlcoreError, match=r"rollout engine 'bare' registered by .*bare.* is a function; expected an "
                                          r"rlcore.api.RolloutEngine"):
        rollout_engine(manager, "bare")


def test_the_plugin_guide_lists_every_engine_capability():
    from rlcore.rollout.declared import CAPABILITIES, RolloutEngine as Contract

    page = (Path(__file__).parents[2] / "docs" / "plugins.md").read_text(encoding="utf-8")
    assert all(f"| `{name}` |" in page for name in CAPABILITIES)
    assert set(CAPABILITIES) == {f.name for f in attrs.fields(Contract)} - {"build", "requires"}
