"""``[async_training]``: defaults, verl's keys where they mean the same, clear refusals otherwise."""

from __future__ import annotations

import pytest

from rlcore.config import load_job
from rlcore.errors import RlcoreError


def settings(*overrides: str):
    return load_job(None, list(overrides)).config.section("async_training")


def test_auto_is_the_default_and_the_bound_is_in_versions():
    default = settings()  # auto: resolved at the start of a run (test_auto.py); no form asked for yet
    assert default.mode == "auto" and not default.enabled and default.staleness == 1
    assert not settings('async_training.mode="off"').enabled
    split = settings('async_training.mode="split"', "async_training.max_staleness=0",
                     "async_training.rollout_n_gpus_per_node=2")
    assert split.enabled and split.staleness == 0 and split.rollout_n_gpus_per_node == 2


@pytest.mark.parametrize("threshold, staleness", [(0, 0), (1, 1), (2.0, 2)])
def test_verls_whole_staleness_thresholds_map_onto_versions(threshold, staleness):
    assert settings(f"async_training.staleness_threshold={threshold}").staleness == staleness


@pytest.mark.parametrize("override, message", [
    ("async_training.staleness_threshold=0.5", "async_training.staleness_threshold = 0.5: verl's fraction of stale "
                                                "samples has no rlcore equivalent"),
    ("async_training.trigger_parameter_sync_step=2", "async_training.trigger_parameter_sync_step = 2: rlcore syncs"),
    ("async_training.partial_rollout=true", "async_training.partial_rollout = true: the 'hf' rollout engine cannot "
                                            "take new weights in the middle of a generation; use rollout.name = "
                                            "one of 'vllm'"),
    ("async_training.require_batches=4", "async_training.require_batches = 4: rlcore trains whole batches"),
    ('async_training.mode="fully"', "async_training.mode: expected one of 'auto', 'off', 'split', 'colocated'"),
])
def test_what_rlcore_cannot_do_is_refused_naming_the_key(override, message):
    with pytest.raises(RlcoreError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_job(None, [override])


def test_a_threshold_and_a_bound_that_disagree_are_refused():
    with pytest.raises(RlcoreError, match="staleness_threshold = 1 and async_training.max_staleness = 2 disagree"):
        load_job(None, ["async_training.staleness_threshold=1", "async_training.max_staleness=2"])


def test_features_the_async_controller_lacks_are_refused_when_it_is_on():
    with pytest.raises(RlcoreError, match=r"async_training.mode = 'split' does not support "
                                          r"algorithm.filter_groups.enable"):
        load_job(None, ['async_training.mode="split"', "algorithm.filter_groups.enable=true"])
    load_job(None, ["algorithm.filter_groups.enable=true"])  # auto (lockstep where these are on) and off: fine


def test_partial_rollouts_need_an_engine_that_takes_weights_mid_generation_and_one_rank_per_engine():
    job = load_job(None, ['async_training.mode="colocated"', "async_training.partial_rollout=true",
                          'rollout.name="vllm"'])
    assert job.config.section("async_training").partial_rollout
    with pytest.raises(RlcoreError, match=r"partial_rollout = true with async_training.mode = 'off': in lockstep"):
        load_job(None, ['async_training.mode="off"', "async_training.partial_rollout=true", 'rollout.name="vllm"'])
    with pytest.raises(RlcoreError, match=r"partial_rollout = true with rollout.tensor_model_parallel_size = 2: the "
                                          r"ranks of one engine would take new weights at different steps"):
        load_job(None, ['async_training.mode="colocated"', "async_training.partial_rollout=true",
                        'rollout.name="vllm"', "rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"])


@pytest.mark.parametrize("mode", ["split", "colocated"])
def test_an_asynchronous_form_without_ray_is_refused(mode):
    """Its rollout workers are Ray actors: with ``trainer.ray = false`` the job started a default Ray of
    its own anyway (no ``trainer.ray`` settings, no temp-folder clean-up) instead of running without Ray."""
    with pytest.raises(RlcoreError, match=rf"async_training.mode = '{mode}' runs its rollout workers as Ray actors, "
                                          r"but trainer.ray = false"):
        load_job(None, [f'async_training.mode="{mode}"', "trainer.ray=false"])
    assert settings('async_training.mode="auto"', "trainer.ray=false").mode == "auto"  # resolves to lockstep


def test_engines_per_device_is_the_colocated_forms_with_engines_of_one_device():
    job = load_job(None, ['async_training.mode="colocated"', "async_training.engines_per_device=2"])
    assert job.config.section("async_training").engines_per_device == 2
    load_job(None, ["async_training.engines_per_device=2"])  # auto may become colocated (its start line says)
    load_job(None, ['async_training.mode="off"', "async_training.engines_per_device=2"])  # unused, said at start
    with pytest.raises(RlcoreError, match=r"async_training.engines_per_device = 2 is for the colocated form, "
                                          r"and mode = 'split': the split form gives the engines devices of their own"):
        load_job(None, ['async_training.mode="split"', "async_training.engines_per_device=2"])
    with pytest.raises(RlcoreError, match=r"engines_per_device = 3 with rollout.tensor_model_parallel_size = 2 and "
                                          r"rollout.data_parallel_size = 1: engines sharing a device"):
        load_job(None, ['async_training.mode="colocated"', "async_training.engines_per_device=3", 'rollout.name="vllm"',
                        "rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"])
    with pytest.raises(RlcoreError, match=r"async_training.engines_per_device"):
        load_job(None, ["async_training.engines_per_device=0"])
