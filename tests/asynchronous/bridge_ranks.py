"""Run as 3 ranks by tests/asynchronous/test_bridge.py: rank 0 sends two syncs of buckets over the
weight bridge (beside the default process group), ranks 1 and 2 check what arrives. The argument is the
bridge's route: ``collectives`` (the split form), ``host`` (the colocated form through host memory:
gloo on host tensors, whatever the platform's device collectives are), ``lent`` (the colocated form,
the sender lending its buckets' memory: a shared-memory segment on the CPU), ``lent-device`` (the
same on the platform's device: CUDA IPC, every rank on one GPU). ``lent-receiver-dies`` (2 ranks):
a receiver dies mid-sync (``receiver_dies``)."""

import os
import sys

import torch
import torch.distributed as dist

from rlcore.asynchronous.bridge import WeightBridge
from rlcore.runtime.rendezvous import host_store
from rlcore.runtime.platforms import CpuPlatform, current_platform


def expected(version: int) -> list[list[tuple[str, torch.Tensor]]]:
    """Mixed dtypes and odd sizes, so that byte offsets are not aligned to the next tensor's dtype."""
    gen = torch.Generator().manual_seed(version)
    return [[("a.weight", torch.randn(3, 5, generator=gen)), ("b.bias", torch.randn(7, generator=gen).bfloat16())],
            [("c.ids", torch.arange(5) * version), ("d.scale", torch.randn(1, generator=gen).half()),
             ("e.weight", torch.randn(2, 3, 4, generator=gen))]]


class DeviceCollectivesRefused(CpuPlatform):
    """A platform whose device collectives must not be asked for (as NCCL refuses two ranks on one GPU)."""

    def side_process_group(self, store, rank, world_size, timeout):
        raise AssertionError("the bridge through the host asked for the device's collectives")


class LendingCounted(DeviceCollectivesRefused):
    """The CPU's lending, counting the loans that end."""

    ended = 0

    def share_with_processes(self, flat):
        handle, end_loan = super().share_with_processes(flat)

        def counted():
            end_loan()
            LendingCounted.ended += 1

        return handle, counted


def joined_bridge(platform, world: int, route: str, timeout_s: float) -> tuple[int, WeightBridge]:
    """(this rank, its bridge): the default group first (gloo, as each pool keeps its own), then the
    bridge at an address rank 0 picks and broadcasts."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    address = [None]
    if rank == 0:  # listening before its address is given out
        address = [host_store("127.0.0.1", world)]
    dist.broadcast_object_list(address, src=0)
    return rank, WeightBridge(address[0], rank, world, platform, platform.device(0), timeout_s=timeout_s, route=route)


def main(route: str) -> None:
    on_device = route == "lent-device"
    platform = {"collectives": CpuPlatform, "host": DeviceCollectivesRefused,
                "lent": LendingCounted}[route]() if not on_device else current_platform()
    rank, bridge = joined_bridge(platform, 3, "lent" if on_device else route, timeout_s=60)
    device = platform.device(0)
    want_device = "cpu" if route == "host" else device.type
    for version in (1, 2):
        if rank == 0:
            buckets = [[(name, t.to(device)) for name, t in bucket] for bucket in expected(version)]
            sent = bridge.send(iter(buckets))
            assert sent == sum(t.numel() * t.element_size() for b in expected(version) for _, t in b), sent
            for bucket in buckets:  # the sender's tensors are its own again, and unchanged
                for name, tensor in bucket:
                    tensor.add_(1)
        else:
            received = list(bridge.receive())
            dist.barrier()  # the sender has changed its tensors: what arrived must be copies
            want = expected(version)
            assert [[n for n, _ in b] for b in received] == [[n for n, _ in b] for b in want]
            for got_bucket, want_bucket in zip(received, want):
                for (name, got), (_, wanted) in zip(got_bucket, want_bucket):
                    assert got.dtype == wanted.dtype and got.shape == wanted.shape, name
                    assert got.device.type == want_device, (name, got.device)
                    assert torch.equal(got.cpu(), wanted), name
        if rank == 0:
            dist.barrier()
    if route == "lent" and rank == 0:
        assert LendingCounted.ended == 4, LendingCounted.ended  # every bucket's loan ended
    dist.barrier()  # the default group still works beside the bridge
    bridge.close()
    dist.destroy_process_group()
    print(f"rank {rank} ok", flush=True)


def receiver_dies() -> None:
    """2 ranks: the receiver dies holding the first bucket's handle, unacknowledged; the sender's sync
    fails, and the segment it lent is gone (no shared memory outlives a failed sync)."""
    from pathlib import Path

    platform = LendingCounted()
    rank, bridge = joined_bridge(platform, 2, "lent", timeout_s=30)
    if rank == 1:
        header, handle = bridge._broadcast_object(None)  # the first bucket's message, then death
        print(f"segment {handle[0]}", flush=True)
        os._exit(0)
    lent = []
    share = platform.share_with_processes

    def recorded(flat):
        handle, end_loan = share(flat)
        lent.append(handle[0])
        return handle, end_loan

    platform.share_with_processes = recorded
    try:
        bridge.send(iter(expected(1)))
    except Exception as error:  # noqa: BLE001 - gloo's own error for the dead peer
        print(f"sync failed: {type(error).__name__}", flush=True)
    else:
        raise AssertionError("the sync to a dead receiver succeeded")
    assert len(lent) == 1 and LendingCounted.ended == 1, (lent, LendingCounted.ended)
    assert not (Path("/dev/shm") / lent[0].lstrip("/")).exists(), lent
    print("rank 0 ok: the lent segment is gone", flush=True)


if __name__ == "__main__":
    route = sys.argv[1]
    if route == "lent-receiver-dies":
        os.environ.setdefault("RLCORE_PLATFORM", "cpu")
        receiver_dies()
        sys.exit(0)
    if route != "lent-device":
        os.environ.setdefault("RLCORE_PLATFORM", "cpu")
    main(route)
