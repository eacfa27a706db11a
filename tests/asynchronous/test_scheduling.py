"""The asynchronous controller's schedule, without Ray: which batch is drawn when, under which weights,
how far samples lag, and what a checkpoint records. A stand-in engine group stamps each batch with the
version staged when the batch was submitted: the oldest weights it could run under."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlcore.asynchronous.trainer import AsyncTrainer
from rlcore.asynchronous.workers import POLICY_VERSION
from rlcore.batch import Batch
from rlcore.config import load_job
from rlcore.data.dataset import PromptLoader
from rlcore.metrics.step import Timer
from rlcore.rollout.outputs import response_rows
from rlcore.testing import build_tiny_model

STEPS = 6


class StampingEngines:
    """Stands in for the engine group: ``submit`` notes the staged version, ``collect`` answers "#### 1"."""

    world_size = 1

    def __init__(self, trainer: AsyncTrainer):
        self.trainer = trainer
        self.submitted: list[tuple[int, int]] = []  # (step the batch is for, version staged at submission)

    def submit(self, method, prompts, sampling, entry):
        assert (method, entry) == ("generate", "execute_generation")
        self.submitted.append((self.trainer.next_step, self.trainer.synced_version))
        return prompts, sampling, self.trainer.synced_version

    def collect(self, pending):
        prompts, sampling, version = pending
        tokenizer = self.trainer.tokenizer
        answer = tokenizer.encode("#### 1", add_special_tokens=False) + [tokenizer.eos_token_id]
        ids = prompts["input_ids"].repeat_interleave(sampling.n, dim=0)
        mask = prompts["attention_mask"].repeat_interleave(sampling.n, dim=0)
        rows = response_rows(ids, mask, [answer] * len(ids), [[-0.5] * len(answer)] * len(ids),
                             sampling.max_new_tokens, tokenizer.pad_token_id)
        return rows.update(Batch({POLICY_VERSION: torch.full((len(rows),), version, dtype=torch.int64)}))


def make_trainer(tmp_path, staleness: int) -> AsyncTrainer:
    model = tmp_path / "model"
    if not model.exists():
        build_tiny_model(model)
    rows = [{"data_source": "rlcore/arithmetic", "prompt": [{"role": "user", "content": f"What is {i} - {i} + 1?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"index": i}}
            for i in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    job = load_job(None, [f"model.path={model}", f"data.train_files={tmp_path / 'train.parquet'}",
                          "data.train_batch_size=2", "rollout.n=2", "algorithm.adv_estimator=grpo",
                          "actor.ppo_mini_batch_size=2", f"trainer.total_training_steps={STEPS}",
                          f"trainer.default_local_dir={tmp_path / 'run'}", "async_training.mode=split",
                          f"async_training.max_staleness={staleness}", "reward.num_workers=1"])
    trainer = AsyncTrainer(job, echo=lambda *_: None)
    trainer.rollout_workers = StampingEngines(trainer)
    trainer._push_weights = lambda: setattr(trainer, "synced_version", trainer.policy_version) or {}
    trainer.resume()  # no checkpoint: version 0 staged, the schedule starts at step 1
    return trainer


@pytest.mark.parametrize("staleness", [0, 1, 2, 3])
def test_batches_are_drawn_ahead_within_the_bound_and_checkpoints_point_past_the_last_trained(tmp_path,
                                                                                                staleness):
    trainer = make_trainer(tmp_path, staleness)
    reference = PromptLoader(trainer.train_data, 2, trainer.config.data.shuffle, trainer.config.data.seed)
    lags, ahead = [], []
    try:
        for step in range(1, STEPS + 1):
            trainer.global_step = step
            batch, metrics = trainer.generate(Timer())
            assert batch["score"] == [1.0] * 4  # scored on the driver after arriving
            lags.append(metrics["async/staleness_max"])
            ahead.append(metrics["async/batches_ahead"])
            assert metrics["async/policy_version"] == step - 1
            trainer.sync_weights()  # the update of this step: version ``step``, staged at once
            reference.next_batch()
            assert trainer.checkpoint_state()["loader"] == reference.state_dict(), step
            # the epoch of the batch trained, as lockstep says it, not the loader's, which drew ahead (4 steps an epoch)
            assert trainer.training_epoch() == reference.epoch == (step - 1) // 4, step
            assert trainer.checkpoint_state()["policy_version"] == step
    finally:
        trainer.reward.close()
    # the oldest weights each batch could run under: step k's batch lags min(staleness, k - 1) versions
    assert lags == [min(staleness, k - 1) for k in range(1, STEPS + 1)]
    assert max(ahead) == staleness and ahead[-1] == 0  # nothing drawn past the last step
    steps = [step for step, _ in trainer.rollout_workers.submitted]
    assert steps == list(range(1, STEPS + 1))  # every batch drawn once, in order
    for step, version in trainer.rollout_workers.submitted:
        assert step - 1 - version <= staleness
