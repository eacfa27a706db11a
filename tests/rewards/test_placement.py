"""A response's score lands on its last model token: after a tool result (masked out) too, and an
empty response scores nothing."""

import pytest
import torch

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.rewards.placement import last_token_scores, reward_components, reward_rows
from rlcore.rewards.scorer import RewardResult


def test_each_score_sits_on_its_rows_last_model_token():
    mask = torch.tensor([[1, 1, 1, 0, 0],    # a plain response, then padding
                         [1, 1, 0, 0, 1],    # model, tool result (masked), model again
                         [0, 0, 0, 0, 0]])   # nothing generated
    placed = last_token_scores(torch.tensor([0.5, 2.0, 7.0]), mask)
    assert placed.tolist() == [[0, 0, 0.5, 0, 0], [0, 0, 0, 0, 2.0], [0, 0, 0, 0, 0]]
    assert placed.dtype == torch.float32


def test_rows_carry_scores_extras_and_answers():
    result = RewardResult(torch.tensor([1.0, 0.0]), {"acc": [1.0, 0.0]}, {}, preds=["7", None])
    assert reward_rows(result) == {"acc": [1.0, 0.0], "score": [1.0, 0.0], "pred": ["7", None]}
    assert "pred" not in reward_rows(RewardResult(torch.tensor([1.0]), {}, {}))


def test_reward_components_are_the_named_extras_one_column_each():
    result = RewardResult(torch.tensor([1.5, 0.0]), {"accuracy": [1.0, 0.0], "format": [0.5, 0.0]}, {})
    batch = Batch(rows=reward_rows(result))
    assert reward_components(batch, ("format", "accuracy")).tolist() == [[0.5, 1.0], [0.0, 0.0]]
    with pytest.raises(RlcoreError, match="names 'style', but the reward function returned no such key; it "
                                          "returned: accuracy, format"):
        reward_components(batch, ("style",))
    partial = Batch(rows=reward_rows(RewardResult(torch.tensor([1.0, 0.0]), {"accuracy": [1.0, float("nan")]}, {})))
    with pytest.raises(RlcoreError, match=r"returned 'accuracy' for only some samples \(1 of 2"):
        reward_components(partial, ("accuracy",))
