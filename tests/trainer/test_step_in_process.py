"""``Trainer.step`` in the test's own process (``trainer.ray = false``): the one hybrid worker runs
here, so a step can be driven, inspected and stepped through with a debugger, and its outcome is the
outcome of the same job under Ray."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.config import load_job
from rlcore.errors import ConfigError
from tests.e2e.conftest import gsm8k_parquet, job_overrides, read_metrics, tiny_model, train  # noqa: F401
from tests.trainer.in_process import GRPO, first_step, started_trainer


def actor_weights(trainer) -> dict[str, torch.Tensor]:
    """The actor's full weights, through the contract every backend keeps (the sync to the engine)."""
    actor = trainer.workers.worker.actor
    return {name: tensor.detach().float().clone() for bucket in actor.weights_for_rollout(2**20)
            for name, tensor in bucket}


def test_a_step_in_process_generates_scores_and_updates_the_actor(tiny_model, gsm8k_parquet, tmp_path):
    with started_trainer(tiny_model, gsm8k_parquet, tmp_path / "run") as trainer:
        before = actor_weights(trainer)
        trainer.global_step = 1
        metrics = trainer.step()
        after = actor_weights(trainer)
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["training/global_step"] == 1
    for name in ("actor/pg_loss", "actor/kl_loss", "critic/score/mean", "timing_s/gen", "timing_s/update_actor"):
        assert name in metrics, name
    assert metrics["timing_s/dispatch"] == 0.0  # no remote calls
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "the update changed no weight"


@pytest.mark.slow  # starts Ray
def test_the_in_process_step_is_the_ray_jobs_step(tiny_model, gsm8k_parquet, tmp_path):
    """The same job, one step: under Ray through the CLI, and in this process. The same seeds and
    the same worker code give the same losses and scores."""
    result = train(*job_overrides(tiny_model, gsm8k_parquet, tmp_path / "ray"), *GRPO,
                   "trainer.total_training_steps=1", ray=True, timeout=120)  # about 15 s
    assert result.returncode == 0, result.stdout + result.stderr
    ray_step = read_metrics(tmp_path / "ray")[0]
    local_step, _ = first_step(tiny_model, gsm8k_parquet, tmp_path / "local", "trainer.total_training_steps=1")
    for name in ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy",
                 "actor/grad_norm"):
        assert local_step[name] == pytest.approx(ray_step[name], rel=1e-5, abs=1e-7), name


def test_in_process_refuses_more_than_one_worker(tiny_model, gsm8k_parquet, tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.ray = false runs one worker in this process, but "
                                          r"trainer.nnodes = 1 and trainer.n_gpus_per_node = 2 ask for 2"):
        load_job(None, [*job_overrides(tiny_model, gsm8k_parquet, tmp_path, **{"trainer.n_gpus_per_node": 2}),
                        "trainer.ray=false"])


class LengthReward:
    """A third party's reward (``reward.kind = "length"``): the response's length in tokens."""

    def __init__(self, config, tokenizer, manager, dispatch):
        pass

    def check(self, rows):
        pass

    def score(self, batch):
        from rlcore.api import RewardResult

        lengths = batch["response_mask"].sum(-1).float()
        return RewardResult(lengths, {"long": (lengths > 8).float().tolist()}, {"length_reward/calls": 1.0})

    def close(self):
        pass


def test_a_plugins_reward_scores_the_step(tiny_model, gsm8k_parquet, tmp_path):
    """A reward registered through rlcore_register_rewards and named by reward.kind scores the
    responses; its score lands on each response's last token and its extras reach the metrics."""
    from rlcore.api import hookimpl
    from rlcore.plugins.manager import PluginManager

    class Plugin:
        @staticmethod
        @hookimpl
        def rlcore_register_rewards(register):
            register("length", LengthReward)

    manager = PluginManager(plugins={"length-reward": Plugin})
    with started_trainer(tiny_model, gsm8k_parquet, tmp_path / "run", "reward.kind=length",
                         manager=manager) as trainer:
        trainer.global_step = 1
        batch, _ = trainer.generate(trainer_timer())
    lengths = batch["response_mask"].sum(-1).float()
    assert torch.equal(batch["token_level_scores"].sum(-1), lengths)
    assert batch["score"] == lengths.tolist() and batch["long"] == (lengths > 8).float().tolist()
    assert batch.meta["reward_metrics"]["length_reward/calls"] == 1.0


def trainer_timer():
    from rlcore.metrics.step import Timer

    return Timer()
