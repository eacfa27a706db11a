"""The fsdp critic: a value head on the tiny model's backbone."""

from __future__ import annotations

import attrs
import pytest
import torch
from torch.distributed.tensor import DTensor

from rlcore.batch import Batch
from rlcore.testing import build_critic
from tests.fsdp.helpers import RESPONSE_LENGTH, job, make_batch

VERL_CRITIC_METRICS = {"critic/vf_loss", "critic/vf_clipfrac", "critic/vf_explained_var", "critic/grad_norm",
                       "critic/lr"}


def test_values_cover_the_response_tokens_only(backend, platform, tiny_model_path):
    critic = build_critic(backend, job(tiny_model_path), platform)
    assert all(isinstance(p, DTensor) for p in critic.module.parameters())
    batch = make_batch(4)
    values = critic.compute_values(batch)["values"]
    assert values.shape == (4, RESPONSE_LENGTH) and values.dtype == torch.float32
    assert torch.all(values[~batch["response_mask"].bool()] == 0)
    assert values[batch["response_mask"].bool()].abs().sum() > 0


def test_the_value_loss_falls_on_a_fixed_batch(backend, platform, tiny_model_path):
    config = job(tiny_model_path, critic={"ppo_micro_batch_size_per_gpu": 2, "cliprange_value": 10.0})
    critic = build_critic(backend, config, platform)
    batch = make_batch(4)
    returns = torch.linspace(-1.0, 1.0, 4).unsqueeze(-1).expand(4, RESPONSE_LENGTH).contiguous()
    losses = []
    for _ in range(8):  # the trainer's loop: fresh values each step, then an update toward the returns
        step = batch.update(critic.compute_values(batch)).update(Batch({"returns": returns}))
        metrics = critic.update(step)
        losses.append(metrics["critic/vf_loss"])
    assert VERL_CRITIC_METRICS <= set(metrics)
    assert losses[-1] < 0.5 * losses[0]
    assert metrics["critic/vf_explained_var"] > 0  # the values it was given already explain the returns
    assert metrics["critic/lr"] == pytest.approx(1e-3)


def test_the_critic_defaults_to_the_actors_model_and_can_take_its_own(backend, platform, tiny_model_path, tmp_path):
    from rlcore.testing import build_tiny_model

    other = build_tiny_model(tmp_path / "other", hidden_size=32, seed=1)
    config = job(tiny_model_path)
    own_model = attrs.evolve(config.critic, model=attrs.evolve(config.critic.model, path=str(other)))
    default = build_critic(backend, config, platform)
    own = build_critic(backend, attrs.evolve(config, critic=own_model), platform)
    assert default.module.config.hidden_size == 64 and own.module.config.hidden_size == 32
