"""The fsdp backend skips a non-finite update, counts it, and never saves non-finite weights."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.testing import build_actor
from tests.fsdp.helpers import RESPONSE_LENGTH, job, make_batch


def test_a_non_finite_loss_skips_the_update_and_is_counted(backend, platform, tiny_model_path):
    actor = build_actor(backend, job(tiny_model_path), platform)
    actor.set_total_steps(10)
    batch = make_batch(4)
    batch = batch.update(actor.compute_log_prob(batch))
    local = lambda: [(p.to_local() if hasattr(p, "to_local") else p).detach().clone()  # noqa: E731
                     for p in actor.module.parameters()]
    before = local()
    metrics = actor.update(batch.update(Batch({"advantages": torch.full((4, RESPONSE_LENGTH), math.nan)})))
    assert metrics["actor/nonfinite_updates"] == 1.0 and not math.isfinite(metrics["actor/grad_norm"])
    assert all(torch.equal(a, b) for a, b in zip(before, local()))
    metrics = actor.update(batch.update(Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)})))
    assert metrics["actor/nonfinite_updates"] == 0.0


def test_non_finite_weights_are_never_saved(backend, platform, tiny_model_path, tmp_path):
    actor = build_actor(backend, job(tiny_model_path), platform)
    with torch.no_grad():
        name, param = next(iter(actor.module.named_parameters()))
        (param.to_local() if hasattr(param, "to_local") else param).fill_(math.inf)
    with pytest.raises(RlcoreError, match=rf"not saving the actor: its weight {name} holds non-finite"):
        actor.save(str(tmp_path / "actor"))
    assert not (tmp_path / "actor").exists()


def test_a_skipped_update_names_the_parameters_whose_gradients_are_not_finite(caplog):
    from rlcore_fsdp.optim import clip_and_step

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 3)).sum().backward()
    model[1].bias.grad.fill_(math.nan)
    before = [p.detach().clone() for p in model.parameters()]
    with caplog.at_level("WARNING", logger="rlcore_fsdp.optim"):
        assert math.isnan(clip_and_step(model, optimizer, 1.0, "critic"))
    assert "critic: gradient norm nan, update skipped; non-finite gradients in 1 of 4 parameters: 1.bias" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    model(torch.ones(2, 3)).sum().backward()  # finite again: a step, no warning
    caplog.clear()
    assert math.isfinite(clip_and_step(model, optimizer, 1.0, "critic")) and not caplog.text
