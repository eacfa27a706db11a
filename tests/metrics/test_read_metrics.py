"""A step's metrics read as numbers once: the losses hand them over as 0-d tensors."""

from __future__ import annotations

import torch

from rlcore.metrics.step import read_metrics


def test_tensors_are_read_as_floats_and_numbers_pass_through():
    metrics = {"actor/pg_loss": torch.tensor(0.25), "actor/grad_norm": 1.5, "actor/ppo_kl": torch.tensor(-2.0,
               dtype=torch.bfloat16), "actor/lr": 3e-6, "actor/steps": 2}
    read = read_metrics(metrics)
    assert read == {"actor/pg_loss": 0.25, "actor/grad_norm": 1.5, "actor/ppo_kl": -2.0, "actor/lr": 3e-6,
                    "actor/steps": 2.0}
    assert list(read) == list(metrics) and all(type(value) is float for value in read.values())


def test_a_tensor_in_the_graph_is_read_without_its_gradient_and_nothing_is_read_from_nothing():
    weight = torch.tensor(2.0, requires_grad=True)
    assert read_metrics({"loss": weight * 3}) == {"loss": 6.0}
    assert read_metrics({}) == {}
