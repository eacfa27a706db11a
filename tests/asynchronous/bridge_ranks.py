"""Run as 3 ranks by tests/asynchronous/test_bridge.py: rank 0 sends two syncs of buckets over the
weight bridge (beside the default process group), ranks 1 and 2 check what arrives. With the argument
``through-host``, the bridge of the colocated form: gloo on host tensors, whatever the platform's
device collectives are."""

import os
import socket
import sys

import torch
import torch.distributed as dist

from rlcore.asynchronous.bridge import WeightBridge
from rlcore.platforms import CpuPlatform


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


def main(through_host: bool) -> None:
    dist.init_process_group("gloo")  # the default group, as each pool keeps its own
    rank = dist.get_rank()
    address = [None]
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            address = [f"127.0.0.1:{s.getsockname()[1]}"]
    dist.broadcast_object_list(address, src=0)
    platform = DeviceCollectivesRefused() if through_host else CpuPlatform()
    bridge = WeightBridge(address[0], rank, 3, platform, platform.device(0), timeout_s=60, through_host=through_host)
    for version in (1, 2):
        if rank == 0:
            sent = bridge.send(iter(expected(version)))
            assert sent == sum(t.numel() * t.element_size() for b in expected(version) for _, t in b), sent
        else:
            received = list(bridge.receive())
            want = expected(version)
            assert [[n for n, _ in b] for b in received] == [[n for n, _ in b] for b in want]
            for got_bucket, want_bucket in zip(received, want):
                for (name, got), (_, wanted) in zip(got_bucket, want_bucket):
                    assert got.dtype == wanted.dtype and got.shape == wanted.shape, name
                    assert got.device.type == "cpu", name
                    assert torch.equal(got, wanted), name
    dist.barrier()  # the default group still works beside the bridge
    bridge.close()
    dist.destroy_process_group()
    print(f"rank {rank} ok", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("RLCORE_PLATFORM", "cpu")
    main(through_host=sys.argv[1:] == ["through-host"])
