"""The built-in algorithms are ordinary plugins: registered by name, listed, and checked at load time."""

import json

import pytest

from rlcore.algorithms.advantages import ESTIMATORS
from rlcore.config import load_job
from rlcore.errors import ConfigError
from rlcore.plugins.manager import PluginManager
from tests.conftest import run_rlcore

ADVANTAGE_ESTIMATORS = {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo",
                        "gpg", "remax", "gdpo", "optimal_token_baseline"}
POLICY_LOSSES = {"vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "cispo", "geo_mean", "sapo", "dppo_tv", "dppo_kl"}
KL_BASE = {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"}
KL_ESTIMATORS = KL_BASE | {name + "+" for name in KL_BASE}
SMALL = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4"]


def test_every_built_in_name_is_registered_by_the_core():
    manager = PluginManager(autoload=False)
    assert set(manager.registry("advantage_estimators").names()) == ADVANTAGE_ESTIMATORS
    assert set(manager.registry("policy_losses").names()) == POLICY_LOSSES
    assert set(manager.registry("kl_estimators").names()) == KL_ESTIMATORS
    entry = manager.registry("advantage_estimators").entry("grpo")
    assert entry.provider.plugin == "rlcore.algorithms.plugin" and entry.provider.distribution == "rlcore"


def test_rlcore_plugins_lists_them():
    result = run_rlcore("plugins", "--json", env={"RLCORE_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert result.returncode == 0, result.stderr
    (plugin,) = [p for p in json.loads(result.stdout)["plugins"] if p["name"] == "rlcore.algorithms.plugin"]
    assert plugin["registered"] == {"advantage_estimators": sorted(ADVANTAGE_ESTIMATORS),
                                    "kl_estimators": sorted(KL_ESTIMATORS),
                                    "policy_losses": sorted(POLICY_LOSSES),
                                    # the checks of these settings, verl's rollout_correction table and
                                    # verl's keys of [distillation]
                                    "job_checks": ["advantage_estimator", "distillation", "kl", "policy_loss",
                                                   "rollout_correction"],
                                    "verl_keys": ["distillation", "rollout_correction"]}


GROUP_ESTIMATORS = sorted(name for name, e in ESTIMATORS.items() if e.needs_groups)


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_group_estimators_warn_about_n_of_one_when_the_job_is_loaded(name):
    settings = {"gdpo": ["algorithm.gdpo_reward_keys=['accuracy']"],
                "optimal_token_baseline": ["actor.calculate_sum_pi_squared=true"]}.get(name, [])
    job = load_job(None, [f"algorithm.adv_estimator={name}", "rollout.n=1", *SMALL, *settings], manager=PluginManager())
    assert any(w.startswith(f"algorithm.adv_estimator = {name!r} compares samples within a group, but rollout.n = 1")
               for w in job.warnings)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS - set(GROUP_ESTIMATORS)))
def test_estimators_without_groups_accept_n_of_one(name):
    with pytest.raises(ConfigError) as info:  # the backend and rollout engine are still unknown here
        load_job(None, [f"algorithm.adv_estimator={name}", "rollout.n=1", *SMALL],
                 manager=PluginManager(autoload=False))
    assert not any("rollout.n must be" in p for p in info.value.problems)
    assert not any(p.startswith(("algorithm.", "actor.")) for p in info.value.problems)


@pytest.mark.parametrize(("key", "value"), [("actor.policy_loss", "gspo"), ("actor.kl_loss_type", "k3+"),
                                            ("algorithm.kl_penalty", "low_var_kl"),
                                            ("actor_rollout_ref.actor.policy_loss.loss_mode", "clip_cov")])
def test_names_in_a_job_resolve_including_verl_keys(key, value):
    with pytest.raises(ConfigError) as info:
        load_job(None, [f"{key}={value}", *SMALL], manager=PluginManager(autoload=False))
    assert not any(p.startswith(("algorithm.", "actor.")) for p in info.value.problems)


def test_a_misspelled_loss_lists_the_registered_ones():
    with pytest.raises(ConfigError) as info:
        load_job(None, ["actor.policy_loss=vanila", *SMALL], manager=PluginManager(autoload=False))
    assert any(p.startswith("actor.policy_loss: unknown policy_losses name 'vanila'") and 'did you mean "vanilla"' in p
               for p in info.value.problems)
