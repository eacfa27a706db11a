"""``loss_weights`` and ``mini_batch_rows``: one computation of each, in the core, that both training
backends use; the fsdp and megatron backends give the same weights for the same micro-batches."""

from __future__ import annotations

import pytest
import torch

from rlcore.api import Batch, RlcoreError, loss_weights, mini_batch_rows

# three micro-batches of one mini-batch: 2 rows with 3 and 1 tokens, 1 row with 2, 2 rows of which one is empty
MASKS = [torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]), torch.tensor([[1, 1, 0, 0]]),
         torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]])]


@pytest.mark.parametrize(("mode", "expected"), [
    ("token-mean", [4 / 10, 2 / 10, 4 / 10]),  # shares of the 10 response tokens
    ("seq-mean-token-mean", [2 / 4, 1 / 4, 1 / 4]),  # shares of the 4 sequences with tokens
    ("seq-mean-token-sum", [2 / 4, 1 / 4, 1 / 4]),
    ("seq-mean-token-sum-norm", [2 / 4, 1 / 4, 1 / 4]),
])
def test_each_micro_batch_weighs_its_share_of_the_mini_batch(mode, expected):
    assert loss_weights(MASKS, mode, replicas=1) == pytest.approx(expected)
    # two data-parallel ranks: the backend averages gradients over them, the counts are summed over both
    doubled = loss_weights(MASKS, mode, replicas=2, global_sum=lambda count: 2 * count)
    assert doubled == pytest.approx(expected)


def test_a_filler_weighs_nothing_and_an_empty_mini_batch_gives_zeros():
    assert loss_weights([MASKS[0], None], "token-mean", replicas=1) == [1.0, 0.0]
    assert loss_weights([torch.zeros(1, 3)], "seq-mean-token-mean", replicas=1) == [0.0]


def test_both_backends_weigh_the_same_micro_batches_alike():
    from rlcore_fsdp.batching import MicroBatch
    from rlcore_fsdp.batching import micro_weights as fsdp_weights

    try:
        from rlcore_megatron.compute import Micro
        from rlcore_megatron.compute import micro_weights as megatron_weights
    except ImportError as exc:  # megatron-core is installed in CI's third environment only
        pytest.skip(f"rlcore_megatron.compute needs megatron-core here ({exc})")
    fsdp = [MicroBatch(Batch({"response_mask": m}), torch.arange(len(m))) for m in MASKS]
    empty = torch.zeros(0, 4)
    megatron = [Micro(input_ids=empty, predictors=empty, responses=empty, extras={"response_mask": m},
                      rows=torch.arange(len(m))) for m in MASKS]
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert fsdp_weights(fsdp, mode) == megatron_weights(megatron, mode, 1, torch.device("cpu"))


def test_a_mini_batch_splits_into_equal_rows_per_rank_or_says_why_not():
    assert mini_batch_rows(4, 8, 2, "actor") == 16
    with pytest.raises(RlcoreError, match=r"actor.ppo_mini_batch_size x rollout.n = 15 samples do not split evenly "
                                          r"over 2 data-parallel ranks"):
        mini_batch_rows(3, 5, 2, "actor")
