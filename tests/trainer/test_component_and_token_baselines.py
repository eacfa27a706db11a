"""GDPO and the optimal token baseline inside a real step (``trainer.ray = false``, the tiny model, the
hf engine, the fsdp actor): the reward's components and the actor's sum of squared probabilities reach
the estimator, and the advantages have the properties each estimator promises."""

from __future__ import annotations

import math

import torch

from rlcore.metrics.step import Timer
from tests.e2e.conftest import gsm8k_parquet, tiny_model  # noqa: F401
from tests.trainer.in_process import started_trainer, write_length_reward

ROWS = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2"]


def advantages_of_a_step(tiny_model, gsm8k_parquet, run_dir, *extra):
    """(the batch with its advantages, the step's metrics) of one step."""
    with started_trainer(tiny_model, gsm8k_parquet, run_dir, *ROWS, *extra) as trainer:
        trainer.global_step = 1
        batch, _ = trainer.generate(Timer())
        batch = batch.update(trainer.workers.dispatch("compute_log_prob", batch))
        batch, _ = trainer.compute_advantages(batch)
        return batch, trainer.step()


def test_gdpo_reads_the_reward_functions_components(tiny_model, gsm8k_parquet, tmp_path):
    reward = tmp_path / "two_parts.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    accuracy, style = float(len(solution_str) % 2), (len(solution_str) % 3) / 3\n"
                      "    return {'score': accuracy + style, 'accuracy': accuracy, 'style': style}\n")
    batch, metrics = advantages_of_a_step(
        tiny_model, gsm8k_parquet, tmp_path / "gdpo", "algorithm.adv_estimator=gdpo",
        "algorithm.gdpo_reward_keys=['accuracy', 'style']", f"custom_reward_function.path={reward}")
    assert all(math.isfinite(v) for v in metrics.values())
    mask = batch["response_mask"].bool()
    tokens = batch["advantages"][mask]
    assert tokens.abs().max() > 0  # the components differ between samples
    # whitened over the batch's tokens: mean 0, unbiased std 1
    assert abs(tokens.mean().item()) < 1e-5 and abs(tokens.std().item() - 1.0) < 1e-4
    assert set(batch["accuracy"]) <= {0.0, 1.0} and len(batch["style"]) == len(batch)  # the rows it read


def test_the_optimal_token_baseline_zeroes_the_path_weighted_advantages_of_each_group(tiny_model, gsm8k_parquet,
                                                                                      tmp_path):
    reward = write_length_reward(tmp_path)
    batch, metrics = advantages_of_a_step(
        tiny_model, gsm8k_parquet, tmp_path / "otb", "algorithm.adv_estimator=optimal_token_baseline",
        "actor.calculate_sum_pi_squared=true", f"custom_reward_function.path={reward}")
    assert all(math.isfinite(v) for v in metrics.values())
    mask = batch["response_mask"].bool()
    squares, pi = batch["sum_pi_squared"][mask], batch["old_log_probs"][mask].exp()
    assert ((squares > 0) & (squares <= 1 + 1e-6) & (squares >= pi.square() - 1e-6)).all()
    assert batch["advantages"][mask].abs().max() > 0
    # at the first position B_0 = sum_i W_i0 G_i0 / sum_i W_i0, so the W-weighted advantages of a group sum to 0
    first_w = 1 - 2 * batch["old_log_probs"][:, 0].exp() + batch["sum_pi_squared"][:, 0]  # (B,) W at t = 0
    uids = batch["uid"]
    for uid in set(uids):
        rows = torch.tensor([i for i, u in enumerate(uids) if u == uid])
        if mask[rows].sum(-1).sort().values[-2] == 0:
            continue  # a group whose second longest response is empty has no baseline past the start
        weighted = (first_w[rows] * batch["advantages"][rows, 0]).sum()
        assert abs(weighted.item()) < 1e-5 * max(1.0, batch["returns"][rows, 0].abs().max().item())
