"""The reward model (``reward.model``; verl's ``reward_model.*``) scores each conversation as
transformers' sequence-classification model does, in micro-batches, and refuses what it cannot use."""

from __future__ import annotations

import pytest
import torch

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.models.loading import EMBEDDED_MODEL
from rlcore.rewards.config import RewardModelConfig
from rlcore.rewards.model import RewardModel
from rlcore.runtime.platforms import CpuPlatform
from rlcore.testing import build_tiny_reward_model

MESSAGES = [[{"role": "user", "content": "What is 3 + 4?"}], [{"role": "user", "content": "2 * 5 ="}],
            [{"role": "system", "content": "You are a helpful model."}, {"role": "user", "content": "how many"}]]
RESPONSES = ["3 + 4 = 7. #### 7", "10", "she bought apples each week and sold half of the books"]


@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory):
    return build_tiny_reward_model(tmp_path_factory.mktemp("reward-models") / "tiny-rm")


def config_for(path, **options) -> RewardModelConfig:
    return RewardModelConfig(enable=True, path=str(path), **options)


def reward_model(options: RewardModelConfig) -> RewardModel:
    """The reward model as a job with the default [model] table builds it."""
    return RewardModel(options, CpuPlatform(), policy_tokenizer=EMBEDDED_MODEL, dtype="auto")


def test_scores_are_transformers_scores_of_the_chat_templated_conversation(reward_model_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rm = reward_model(config_for(reward_model_path, micro_batch_size_per_gpu=2))
    scores = rm.score(Batch(rows={"raw_prompt": MESSAGES, "response": RESPONSES}))["rm_scores"]

    tokenizer = AutoTokenizer.from_pretrained(reward_model_path)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_path, dtype=torch.float32).eval()
    expected = []
    for messages, response in zip(MESSAGES, RESPONSES):  # one at a time: no padding at all
        text = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": response}], tokenize=False)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            expected.append(model(input_ids=ids).logits[0, 0])
    torch.testing.assert_close(scores, torch.stack(expected), atol=1e-5, rtol=1e-5)
    assert scores.shape == (3,) and len(set(scores.tolist())) == 3


def test_a_model_with_other_than_one_label_or_no_path_is_refused(reward_model_path, tmp_path):
    with pytest.raises(RlcoreError, match="needs reward.model.path"):
        reward_model(RewardModelConfig(enable=True))
    from transformers import AutoConfig

    two = tmp_path / "two-labels"
    config = AutoConfig.from_pretrained(reward_model_path)
    config.num_labels = 2
    build_tiny_reward_model(two)
    config.save_pretrained(two)
    with pytest.raises(RlcoreError, match="has 2 labels; a reward model has one"):
        reward_model(config_for(two))
