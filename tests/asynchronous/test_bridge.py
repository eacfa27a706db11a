"""The weight bridge: buckets of mixed dtypes sent from one rank to two, twice, over gloo: on the
platform's collectives (the split form), through host memory and in memory the sender lends (the
colocated form); on a GPU, lent by CUDA IPC to processes on the same device."""

import pytest

from tests.ranks import run_ranks


@pytest.mark.parametrize("route", ["collectives", "host", "lent"])
def test_buckets_arrive_bit_for_bit_on_every_rollout_rank(route):
    run_ranks("tests.asynchronous.bridge_ranks", route, world=3, timeout=120)


def test_buckets_lent_by_cuda_ipc_arrive_bit_for_bit_on_the_same_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("CUDA IPC needs a GPU: three processes on GPU 0 lend and map its memory")
    run_ranks("tests.asynchronous.bridge_ranks", "lent-device", world=3, timeout=180, one_gpu_for_all=True)


def test_a_receiver_that_dies_mid_sync_fails_the_sync_and_leaves_no_shared_segment():
    run_ranks("tests.asynchronous.bridge_ranks", "lent-receiver-dies", world=2, timeout=120)
