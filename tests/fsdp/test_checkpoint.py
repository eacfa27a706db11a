"""Actor and critic checkpoints on one rank: exact round trips, atomic writes, resumable training.
(Saving at 2 ranks and loading at 2 or 1 is in test_two_ranks.py.)"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

import rlcore_fsdp.checkpoint as checkpoint
from rlcore.batch import Batch
from rlcore.config.schema import CheckpointContents, OptimConfig
from rlcore.errors import RlcoreError
from rlcore.testing import build_actor, build_critic
from tests.fsdp.helpers import RESPONSE_LENGTH, full_weights, job, make_batch

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def optimizer_state(role) -> dict:
    return get_optimizer_state_dict(role.module, role.optimizer, options=FULL)


def assert_same_tree(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_tree(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_tree(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b


def trained_actor(backend, platform, model_path, steps: int = 1):
    config = job(model_path, actor={"optim": OptimConfig(lr=1e-3, weight_decay=0.0, warmup_steps=3)})
    actor = build_actor(backend, config, platform)
    actor.set_total_steps(10)
    batch = make_batch(4)
    for _ in range(steps):
        actor.update(batch.update(actor.compute_log_prob(batch)).update(
            Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)})))
    return actor, config, batch


def test_save_then_load_restores_weights_optimizer_and_schedule_exactly(backend, platform, tiny_model_path, tmp_path):
    actor, config, batch = trained_actor(backend, platform, tiny_model_path)
    actor.save(str(tmp_path / "actor"))
    assert sorted(os.listdir(tmp_path / "actor")) == ["huggingface", "shards", "state.json"]
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= set(
        os.listdir(tmp_path / "actor" / "huggingface"))
    assert json.loads((tmp_path / "actor" / "huggingface" / "config.json").read_text())["architectures"] == [
        "Qwen2ForCausalLM"]

    resumed = build_actor(backend, config, platform)
    resumed.load(str(tmp_path / "actor"))
    for name, value in full_weights(actor).items():
        assert torch.equal(full_weights(resumed)[name], value), name
    assert_same_tree(optimizer_state(resumed), optimizer_state(actor))
    assert resumed.schedule.step == actor.schedule.step == 1 and resumed.schedule.total_steps == 10

    # the next step is the same step: same learning rate (warmup), same Adam moments, same weights
    step = batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)}))
    assert resumed.update(step) == actor.update(step)
    for name, value in full_weights(actor).items():
        assert torch.equal(full_weights(resumed)[name], value), name


def test_a_save_without_the_optimizer_holds_no_optimizer_state_and_resumes_with_a_fresh_one(
        backend, platform, tiny_model_path, tmp_path, caplog):
    config = job(tiny_model_path, actor={"optim": OptimConfig(lr=1e-3, weight_decay=0.0, warmup_steps=3),
                                         "checkpoint": CheckpointContents(("model", "extra"))})
    actor = build_actor(backend, config, platform)
    actor.set_total_steps(10)
    batch = make_batch(4)
    step = batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)}))
    actor.update(step)
    actor.save(str(tmp_path / "actor"))
    stored = checkpoint.saved_keys(tmp_path / "actor")
    assert stored and all(key.startswith("model.") for key in stored)  # weights only, no AdamW moments
    assert json.loads((tmp_path / "actor" / "state.json").read_text())["contents"] == ["model", "extra"]

    resumed = build_actor(backend, config, platform)
    resumed.set_total_steps(10)
    with caplog.at_level("WARNING", logger="rlcore_fsdp.checkpoint"):
        resumed.load(str(tmp_path / "actor"))
    (warning,) = [r.getMessage() for r in caplog.records if "holds no optimizer state" in r.getMessage()]
    assert "the actor resumes with a fresh AdamW" in warning
    for name, value in full_weights(actor).items():
        assert torch.equal(full_weights(resumed)[name], value), name
    assert not resumed.optimizer.state and resumed.schedule.step == 1  # fresh moments; the schedule goes on
    # the next update starts Adam afresh from the saved weights: it equals a fresh optimizer's first step there
    fresh = build_actor(backend, config, platform)
    fresh.set_total_steps(10)
    fresh.load(str(tmp_path / "actor"))
    resumed_metrics = resumed.update(step)
    assert all(math.isfinite(value) for value in resumed_metrics.values())
    assert resumed_metrics == fresh.update(step)
    moved = [name for name, value in full_weights(actor).items() if not torch.equal(full_weights(resumed)[name], value)]
    assert moved  # it trained


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint(backend, platform, tiny_model_path, tmp_path,
                                                                   monkeypatch):
    actor, config, batch = trained_actor(backend, platform, tiny_model_path)
    target = tmp_path / "actor"
    actor.save(str(target))
    saved = full_weights(actor)
    actor.update(batch.update(actor.compute_log_prob(batch)).update(
        Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)})))

    def crash(*args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(checkpoint, "write_hf_files", crash)  # the shards are written, the rest is not
    with pytest.raises(OSError, match="simulated"):
        actor.save(str(target))
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["actor"]  # no half-written folder left behind

    resumed = build_actor(backend, config, platform)
    resumed.load(str(target))
    for name, value in saved.items():
        assert torch.equal(full_weights(resumed)[name], value), name


def test_a_crash_between_the_two_renames_is_recovered(backend, platform, tiny_model_path, tmp_path, monkeypatch):
    """Replacing a checkpoint moves the old one aside, then the new one in; dying in between leaves
    only the aside copy, which load (and the next save) put back."""
    actor, config, _ = trained_actor(backend, platform, tiny_model_path)
    target = tmp_path / "actor"
    actor.save(str(target))
    saved = full_weights(actor)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the new folder's move into place
            raise KeyboardInterrupt("killed (simulated)")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        actor.save(str(target))
    monkeypatch.undo()
    assert not target.exists() and (tmp_path / ".actor.old" / "state.json").is_file()

    resumed = build_actor(backend, config, platform)
    resumed.load(str(target))
    assert target.is_dir() and not (tmp_path / ".actor.old").exists()
    for name, value in saved.items():
        assert torch.equal(full_weights(resumed)[name], value), name


def test_loading_from_a_folder_that_is_no_checkpoint_says_so(backend, platform, tiny_model_path, tmp_path):
    actor = build_actor(backend, job(tiny_model_path), platform)
    with pytest.raises(RlcoreError, match="not a complete rlcore fsdp checkpoint"):
        actor.load(str(tmp_path / "nothing"))
    old = tmp_path / "old"
    old.mkdir()
    (old / "state.json").write_text(json.dumps({"format": 1, "role": "actor"}))
    with pytest.raises(RlcoreError, match="format 1.*model.path"):
        actor.load(str(old))


def test_loading_weights_of_another_model_names_the_mismatch(backend, platform, tiny_model_path, tmp_path):
    from rlcore.testing import build_tiny_model

    other = build_tiny_model(tmp_path / "three-layers", num_layers=3)
    build_actor(backend, job(other), platform).save(str(tmp_path / "actor"))
    with pytest.raises(RlcoreError, match=r"do not fit the model: missing \[\], unexpected \['model.layers.2"):
        build_actor(backend, job(tiny_model_path), platform).load(str(tmp_path / "actor"))


def test_critic_round_trip(backend, platform, tiny_model_path, tmp_path):
    config = job(tiny_model_path)
    critic = build_critic(backend, config, platform)
    batch = make_batch(4)
    batch = batch.update(critic.compute_values(batch)).update(Batch({"returns": torch.ones(4, RESPONSE_LENGTH)}))
    critic.update(batch)
    critic.save(str(tmp_path / "critic"))
    resumed = build_critic(backend, config, platform)
    resumed.load(str(tmp_path / "critic"))
    assert_same_tree(optimizer_state(resumed), optimizer_state(critic))
    torch.testing.assert_close(resumed.compute_values(batch)["values"], critic.compute_values(batch)["values"],
                               atol=0, rtol=0)
