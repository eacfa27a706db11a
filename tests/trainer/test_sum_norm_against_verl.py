"""A GRPO job with Dr.GRPO's aggregation (``actor.loss_agg_mode = "seq-mean-token-sum-norm"``) logs
the ``actor/pg_loss`` that verl 0.9.1's own formula gives on the batch the actor trained on: the mean
over sequences of each one's token sum, divided by ``data.max_response_length``."""

from __future__ import annotations

import pytest
import torch

from tests.e2e.conftest import gsm8k_parquet, tiny_model  # noqa: F401
from tests.trainer.in_process import started_trainer
from tests.verl_reference import import_verl

verl = import_verl()


def write_character_reward(folder):
    """A reward function file scoring a response by its characters' code points (mod 7, in [0, 1))."""
    path = folder / "by_characters.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return float(sum(map(ord, solution_str)) % 7) / 7\n")
    return path


def test_grpo_with_seq_mean_token_sum_norm_logs_verls_pg_loss(tiny_model, gsm8k_parquet, tmp_path):
    reward = write_character_reward(tmp_path)
    # The tiny model's responses all run to max_response_length, so within a group of several samples
    # the centred advantages would sum to 0 and so would the loss: groups of one (rollout.n = 1) keep
    # their scores as advantages (in verl too). One mini-batch of 8 rows in 4 micro-batches of 2, one
    # epoch: the update is on-policy (ratio 1), so the loss is the aggregated -A whatever the log-probs.
    overrides = ["actor.loss_agg_mode=seq-mean-token-sum-norm", "algorithm.norm_adv_by_std_in_grpo=false",
                 "rollout.n=1", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8",
                 "actor.ppo_micro_batch_size_per_gpu=2", f"custom_reward_function.path={reward}"]
    with started_trainer(tiny_model, gsm8k_parquet, tmp_path / "run", *overrides) as trainer:
        worker, seen = trainer.workers.worker, []
        update = worker.update_actor
        worker.update_actor = lambda batch: (seen.append(batch), update(batch))[1]
        trainer.global_step = 1
        metrics = trainer.step()
        max_response_length = trainer.config.data.max_response_length
    (batch,) = seen
    mask, advantages = batch["response_mask"].float(), batch["advantages"].float()
    assert len(mask) == 8 and (mask.sum(-1) > 0).all()
    old = batch["old_log_probs"].float() if "old_log_probs" in batch else torch.zeros_like(mask)
    config = verl.ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=2, rollout_n=1,
                              loss_agg_mode="seq-mean-token-sum-norm")
    config.global_batch_info.update(dp_size=1, global_batch_size=len(mask), loss_scale_factor=max_response_length)
    expected, _ = verl.core_algos.compute_policy_loss_vanilla(old, old, advantages, mask.bool(),
                                                              "seq-mean-token-sum-norm", config)
    by_hand = float((-advantages * mask).sum() / (len(mask) * max_response_length))
    assert float(expected) == pytest.approx(by_hand, rel=1e-6)
    assert metrics["actor/pg_loss"] == pytest.approx(float(expected), rel=1e-5, abs=1e-7)
    # rlcore's former formula (the token sum / the length) was larger by the sequence count
    assert abs(by_hand) > 1e-4 and metrics["actor/pg_loss"] != pytest.approx(by_hand * len(mask), rel=1e-2)
