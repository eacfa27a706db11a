"""``rlcore.api.weight_buckets``: an actor's named weights in buckets of a byte size, as the megatron and
torchtitan backends hand them to the engines and write them into exported folders."""

from __future__ import annotations

import torch

from rlcore.api import weight_buckets as buckets


def test_buckets_stay_within_their_bound_and_a_larger_tensor_comes_alone():
    tensors = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 20, 30, 100, 5, 5])]  # fp32: 4 bytes each
    result = list(buckets(iter(tensors), bucket_bytes=200))
    assert [[name for name, _ in bucket] for bucket in result] == [["t0", "t1"], ["t2"], ["t3"], ["t4", "t5"]]
    assert all(sum(t.numel() * 4 for _, t in bucket) <= 200 for bucket in result if len(bucket) > 1)


def test_buckets_are_taken_lazily():
    taken = []

    def stream():
        for i in range(4):
            taken.append(i)
            yield f"t{i}", torch.zeros(10)

    iterator = buckets(stream(), bucket_bytes=80)
    next(iterator)
    assert taken == [0, 1, 2]  # the third tensor closed the first bucket; the fourth is not read yet
