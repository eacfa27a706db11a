"""What the actor trains on when rollout importance sampling is on: weighted advantages, the mask
after rejections; and the batch untouched when it is off."""

from __future__ import annotations

import torch

from rlcore.batch import Batch
from rlcore.algorithms.rollout_correction import actor_update_batch


def test_the_weights_scale_the_advantages_and_the_rejections_leave_the_mask():
    batch = Batch({"advantages": torch.tensor([[1.0, -2.0, 3.0]]), "response_mask": torch.tensor([[1, 1, 1]]),
                   "rollout_is_weights": torch.tensor([[0.5, 2.0, 1.0]]),
                   "rollout_is_response_mask": torch.tensor([[1, 0, 1]])})
    update = actor_update_batch(batch)
    assert update["advantages"].tolist() == [[0.5, -4.0, 3.0]]
    assert update["response_mask"].tolist() == [[1, 0, 1]]
    assert batch["advantages"].tolist() == [[1.0, -2.0, 3.0]]  # the step's metrics still see the originals


def test_without_weights_the_batch_is_trained_on_as_it_is():
    batch = Batch({"advantages": torch.ones(2, 3), "response_mask": torch.ones(2, 3, dtype=torch.long)})
    assert actor_update_batch(batch) is batch


def test_rejections_alone_leave_the_mask_and_keep_the_advantages():
    batch = Batch({"advantages": torch.tensor([[1.0, -2.0]]), "response_mask": torch.tensor([[1, 1]]),
                   "rollout_is_response_mask": torch.tensor([[0, 1]])})
    update = actor_update_batch(batch)
    assert update["advantages"].tolist() == [[1.0, -2.0]] and update["response_mask"].tolist() == [[0, 1]]
