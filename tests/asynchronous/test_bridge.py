"""The weight bridge: buckets of mixed dtypes broadcast from one rank to two, twice, over gloo."""

from tests.ranks import run_ranks


def test_buckets_arrive_bit_for_bit_on_every_rollout_rank():
    run_ranks("tests.asynchronous.bridge_ranks", world=3, timeout=120)
