"""Router replay in whole jobs on a tiny Qwen3-MoE with the hf engine and the fsdp backend: R2 (the old
log-prob pass's routing) and R3 (the engine's) train 2 steps with finite losses through the CLI, and, in a
job driven in this process, every forward of the update routes each token as the batch's column says."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.metrics import Timer
from rlcore.routing import tokens_of
from tests.e2e.conftest import job_overrides, read_metrics, train
from tests.trainer.in_process import in_process_trainer

MODES = {"R2": ["actor.router_replay=R2"],
         "R3": ["actor.router_replay=R3", "rollout.return_routed_experts=true"]}
# the entropy bonus gives the update a gradient even when every sample of a group scores alike
GRPO = ["algorithm.adv_estimator=grpo", "rollout.n=2", "actor.shuffle=false", "actor.entropy_coeff=0.01"]


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3-moe", family="qwen3_moe")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_router_replay_job_trains_two_steps_with_finite_losses(tiny_moe, gsm8k_parquet, tmp_path, mode):
    run = tmp_path / mode
    result = train(*job_overrides(tiny_moe, gsm8k_parquet, run, **{"trainer.save_freq": -1}), *GRPO, *MODES[mode],
                   timeout=60)  # about 8 s
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)  # every value finite
    steps = [m for m in metrics if m["step"] >= 1]
    assert [m["step"] for m in steps] == [1, 2]
    for step in steps:
        assert math.isfinite(step["actor/pg_loss"]) and step["actor/grad_norm"] > 0


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_forward_of_the_update_routes_as_the_column(tiny_moe, gsm8k_parquet, tmp_path, mode):
    trainer = in_process_trainer(tiny_moe, gsm8k_parquet, tmp_path / mode, *GRPO, *MODES[mode])
    actor = trainer.workers.worker.actor
    update, seen = actor.update, []

    def recording_update(batch):
        with actor.routing.recording() as records:
            metrics = update(batch)
        seen.append((batch, [torch.cat(calls) for calls in records]))  # per layer: every forward, in order
        return metrics

    actor.update = recording_update
    try:
        for step in (1, 2):
            trainer.global_step = step
            metrics = trainer.step()
            assert all(math.isfinite(v) for v in metrics.values())
        if mode == "R3":  # the engine's column reached the update unchanged by the old log-prob pass
            batch, _ = trainer.generate(Timer())
            assert "routed_experts" in batch
    finally:
        trainer.reward.close()
        trainer.workers.shutdown()
    assert len(seen) == 2
    for batch, layers in seen:
        # one epoch, no shuffling, row micro-batches: the forwards see the rows in the batch's order
        column = tokens_of(batch["routed_experts"], batch["attention_mask"], actor.packed)  # (N, L, K)
        taken = torch.stack(layers, 1).long()
        assert taken.shape == column.shape
        recorded = (column >= 0).all(-1)  # (N, L): tokens with a recorded choice
        assert recorded.float().mean() > 0.5
        assert torch.equal(taken[recorded], column[recorded])
