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


def test_a_bucket_the_device_has_no_room_for_lands_in_host_memory(monkeypatch):
    """An engine beside a trainer on a full card (two engines beside a 1.5B trainer on an 80 GB H100 ran out
    at a weight sync): the bucket lands in host memory, unchanged, and says so; the host's own failure is
    not hidden."""
    import torch

    from rlcore.asynchronous import bridge

    split = bridge._split

    def device_full(flat, header, device):
        if device.type != "cpu":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 28.00 MiB")
        return split(flat, header, device)

    monkeypatch.setattr(bridge, "_split", device_full)
    tensors = [("a.weight", torch.randn(3, 5)), ("b.bias", torch.randn(7).bfloat16())]
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for _, t in tensors])
    header = [(name, tuple(t.shape), t.dtype) for name, t in tensors]
    bucket, device = bridge.landed(flat, header, torch.device("meta"))
    assert device == torch.device("cpu")
    assert [name for name, _ in bucket] == ["a.weight", "b.bias"]
    for (_, got), (_, want) in zip(bucket, tensors):
        assert got.device.type == "cpu" and got.dtype == want.dtype and torch.equal(got, want)

    def host_full(flat, header, device):
        raise torch.OutOfMemoryError("host out of memory")

    monkeypatch.setattr(bridge, "_split", host_full)
    with pytest.raises(torch.OutOfMemoryError):
        bridge.landed(flat, header, torch.device("cpu"))
