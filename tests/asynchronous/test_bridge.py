"""The weight bridge: buckets of mixed dtypes broadcast from one rank to two, twice, over gloo: on the
platform's collectives (the split form) and through host memory (the colocated form)."""

import pytest

from tests.ranks import run_ranks


@pytest.mark.parametrize("route", [(), ("through-host",)], ids=["device-collectives", "through-host"])
def test_buckets_arrive_bit_for_bit_on_every_rollout_rank(route):
    run_ranks("tests.asynchronous.bridge_ranks", *route, world=3, timeout=120)
