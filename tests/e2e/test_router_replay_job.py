"""Router replay in whole jobs on a tiny Qwen3-MoE with the hf engine and the fsdp backend: R2 (the old
log-prob pass's routing) and R3 (the engine's) through the CLI, whose updates reproduce the old pass's
log-probs and whose metrics equal the job's without replay, and, in a job driven in this process, every
forward of the update routes each token as the batch's column says."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.metrics.step import Timer
from rlcore.models.routing import tokens_of
from tests.e2e.conftest import job_overrides, read_metrics, train
from tests.e2e.test_training import deterministic
from tests.trainer.in_process import in_process_trainer

MODES = {"R2": ["actor.router_replay=R2"],
         "R3": ["actor.router_replay=R3", "rollout.return_routed_experts=true"]}
# the entropy bonus gives the update a gradient even when every sample of a group scores alike
GRPO = ["algorithm.adv_estimator=grpo", "rollout.n=2", "actor.shuffle=false", "actor.entropy_coeff=0.01"]


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3-moe", family="qwen3_moe")


def test_router_replay_jobs_replay_exactly_and_train_as_the_job_without_replay(tiny_moe, gsm8k_parquet, tmp_path):
    """R2 and R3 jobs, 2 steps each, beside the same job without replay. One mini-batch per step (one
    optimizer step per update), so the update's forward runs on the weights of the old log-prob pass; the
    engine's log-probs are compared with the old pass's (``algorithm.rollout_is_threshold``: metrics only).
    - the update replays the column at the very tokens it was recorded for: its log-probs equal the old
      pass's (``actor/ppo_kl`` 0, no clipped ratio); a column shifted or misread would route tokens
      elsewhere;
    - under R3 the old pass replays the engine's choices and gets the engine's log-probs (fp32);
    - replaying the choices the router itself makes changes nothing: every metric of every step equals
      the job's without replay (wrong replay weights would change the losses)."""
    single = {"trainer.save_freq": -1, "trainer.test_freq": -1, "trainer.val_before_train": False,
              "actor.ppo_mini_batch_size": 4, "algorithm.rollout_is_threshold": 2.0,
              # an old log-prob pass in every job (R2 needs one; on-policy rollout IS alone would weigh each
              # micro-batch in the update instead), so the three compute the same metrics the same way
              "actor.reuse_on_policy_log_probs": False}
    metrics = {}
    for mode in ("off", *sorted(MODES)):
        run = tmp_path / mode
        result = train(*job_overrides(tiny_moe, gsm8k_parquet, run, **single), *GRPO,
                       *MODES.get(mode, ["actor.router_replay=off"]), timeout=60)  # about 8 s each
        assert result.returncode == 0, result.stdout + result.stderr
        metrics[mode] = read_metrics(run)  # every value finite
        assert [m["step"] for m in metrics[mode]] == [1, 2]
    for mode in sorted(MODES):
        for step in metrics[mode]:
            assert step["actor/ppo_kl"] == 0.0 and step["actor/pg_clipfrac"] == 0.0, (mode, step)
            assert step["actor/grad_norm"] > 0, (mode, step)
            assert abs(step["rollout_corr/kl"]) < 1e-6 and step["rollout_corr/k3_kl"] < 1e-9, (mode, step)
            assert 1 - 1e-5 < step["rollout_corr/rollout_is_min"] <= step["rollout_corr/rollout_is_max"] < 1 + 1e-5
        assert [deterministic(m) for m in metrics[mode]] == [deterministic(m) for m in metrics["off"]], mode


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
