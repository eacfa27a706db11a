"""Generation records (``trainer.rollout_data_dir``, ``validation_data_dir``, ``log_val_generations``):
the prompt and response texts of each row, its score and reward details, written whole or not at all."""

from __future__ import annotations

import io
import json

import pytest
import torch

from rlcore.batch import Batch
from rlcore.runs.generations import REWARD_EXTRA_KEYS, generation_records, sample_generations, write_generations
from rlcore.runs.loggers import ConsoleLogger, MultiLogger
from rlcore.testing import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def scored_batch(tokenizer) -> Batch:
    """Two rows as the trainer holds them after scoring: left-padded prompts, right-padded responses."""
    pad = tokenizer.pad_token_id
    prompts = [tokenizer.encode("What is 7 + 11?"), tokenizer.encode("What is 14 + 22? Think.")]
    responses = [tokenizer.encode("7 + 11 = 18. #### 18"), tokenizer.encode("#### 36")]
    width, length = max(map(len, prompts)), max(map(len, responses))
    prompt_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    response_ids = torch.tensor([r + [pad] * (length - len(r)) for r in responses])
    prompt_mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    response_mask = (torch.arange(length) < torch.tensor([len(r) for r in responses])[:, None]).long()
    rewards = torch.zeros(2, length)
    rewards[0, len(responses[0]) - 1], rewards[1, len(responses[1]) - 1] = 0.9, -0.1
    return Batch({"prompts": prompt_ids, "responses": response_ids, "response_mask": response_mask,
                  "attention_mask": torch.cat([prompt_mask, response_mask], 1), "token_level_rewards": rewards},
                 {"data_source": ["openai/gsm8k"] * 2, "ground_truth": ["18", "35"], "score": [1.0, 0.0],
                  "acc": [1.0, float("nan")], "uid": ["a", "b"]},
                 {REWARD_EXTRA_KEYS: ("acc",)})


def test_records_hold_the_texts_the_score_the_reward_and_the_reward_functions_extras(tokenizer):
    records = generation_records(scored_batch(tokenizer), tokenizer, step=3)
    assert records == [
        {"step": 3, "data_source": "openai/gsm8k", "input": "What is 7 + 11?", "output": "7 + 11 = 18. #### 18",
         "gts": "18", "score": 1.0, "reward": pytest.approx(0.9), "acc": 1.0},
        {"step": 3, "data_source": "openai/gsm8k", "input": "What is 14 + 22? Think.", "output": "#### 36",
         "gts": "35", "score": 0.0, "reward": pytest.approx(-0.1), "acc": None},  # NaN: absent for this row
    ]


def test_records_of_the_asynchronous_mode_hold_the_versions_each_sample_started_and_ended_under(tokenizer):
    batch = scored_batch(tokenizer)
    batch = batch.update(Batch({"policy_version": torch.tensor([2, 2]), "policy_version_last": torch.tensor([2, 3])}))
    records = generation_records(batch, tokenizer, step=4)
    assert [(r["policy_version"], r["policy_version_last"]) for r in records] == [(2, 2), (2, 3)]


def test_a_step_file_is_written_whole_and_a_failed_write_leaves_the_previous_one(tokenizer, tmp_path):
    records = generation_records(scored_batch(tokenizer), tokenizer, step=1)
    path = write_generations(tmp_path / "rollouts", 1, records)
    assert path == tmp_path / "rollouts" / "1.jsonl"
    assert [json.loads(line) for line in path.read_text().splitlines()] == json.loads(json.dumps(records))
    with pytest.raises(TypeError):  # not JSON: fails part way through the file
        write_generations(tmp_path / "rollouts", 1, [records[0], {"output": object()}])
    assert [json.loads(line) for line in path.read_text().splitlines()] == json.loads(json.dumps(records))
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["1.jsonl"]  # no staging file left


def test_the_logged_sample_is_the_same_prompts_at_every_validation_and_the_console_prints_it():
    first = [{"input": f"q{i}", "output": f"a{i}", "score": i / 10} for i in range(10)]
    later = [{"input": f"q{i}", "output": f"b{i}", "score": 1.0} for i in reversed(range(10))]
    chosen = sample_generations(first, 3)
    assert len(chosen) == 3 and [r["input"] for r in sample_generations(later, 3)] == [r["input"] for r in chosen]
    assert sample_generations(first, 50) != first and len(sample_generations(first, 50)) == 10

    stream = io.StringIO()
    MultiLogger([ConsoleLogger(None, None, stream=stream), object.__new__(_MetricsOnly)]).log_generations(chosen, 4)
    text = stream.getvalue()
    assert text.startswith("validation generations at step 4 (3 shown):\n[1] score ")
    assert all(f"input: {r['input']}\noutput: {r['output']}" in text for r in chosen)


class _MetricsOnly:
    """A third-party logger written before ``log_generations`` existed: it is skipped."""

    def log(self, metrics, step):
        raise AssertionError("not called here")
