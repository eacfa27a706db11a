"""The weight bridge: a ``torch.distributed`` process group of its own between a trainer worker (bridge
rank 0) and rollout workers (ranks 1..), over which new weights are broadcast bucket by bucket: the
split form's trainer rank 0 to every rollout worker, over the device's collectives (gloo on the CPU,
NCCL on GPUs); the colocated form's trainer worker to the rollout worker on its own device, through
host memory (``through_host``: gloo on CPU tensors, since NCCL refuses two ranks on one device).

It is built from a ``TCPStore`` and the platform's process-group class directly
(``Platform.side_process_group``), beside each process's default group (the trainer's ranks keep
theirs for their training backend, the rollout pool its own): a process may hold one default group
only. Each bucket travels as a header (names, shapes, dtypes; pickled) and one flat
byte tensor; an empty header ends a sync.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

Bucket = list[tuple[str, torch.Tensor]]
STORE_PREFIX = "rlcore-weight-bridge"


class WeightBridge:
    def __init__(self, address: str, rank: int, world_size: int, platform, device: torch.device,
                 timeout_s: float = 1800.0, through_host: bool = False):
        """``through_host``: gloo on CPU tensors (one copy of each bucket to and from host memory)
        instead of the device's collectives on ``device``."""
        host, port = address.rsplit(":", 1)
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout)
        prefixed = dist.PrefixStore(STORE_PREFIX, store)
        if through_host:
            self.group, self.device = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout), torch.device("cpu")
        else:  # the device's collectives
            self.group, self.device = platform.side_process_group(prefixed, rank, world_size, timeout), device
        self.store = store  # kept alive: the group rendezvoused through it
        self.rank, self.world_size = rank, world_size

    def send(self, buckets: Iterator[Bucket]) -> int:
        """Broadcast every bucket (rank 0); returns the bytes sent."""
        sent = 0
        for bucket in buckets:
            header = [(name, tuple(t.shape), t.dtype) for name, t in bucket]
            flat = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in bucket])
            self._broadcast_object(header)
            self._broadcast(flat.to(self.device))
            sent += flat.numel()
        self._broadcast_object([])
        return sent

    def receive(self) -> Iterator[Bucket]:
        """The buckets rank 0 sends, each as it arrives (ranks 1..); ends with the sync."""
        while header := self._broadcast_object(None):
            sizes = [_numel(shape) * dtype.itemsize for _, shape, dtype in header]
            flat = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
            self._broadcast(flat)
            bucket, offset = [], 0
            for (name, shape, dtype), size in zip(header, sizes):
                # cloned to a storage of its own: a view of another dtype needs an aligned offset
                bucket.append((name, flat[offset:offset + size].clone().view(dtype).reshape(shape)))
                offset += size
            yield bucket

    def close(self) -> None:
        self.group = None
        self.store = None

    # -- pieces ----------------------------------------------------------------------------------
    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def _broadcast_object(self, obj):
        """``obj`` from rank 0 to all; the others pass None and get it back."""
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            length = torch.tensor([payload.numel()], dtype=torch.int64, device=self.device)
            self._broadcast(length)
            self._broadcast(payload.to(self.device))
            return obj
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._broadcast(length)
        payload = torch.empty(int(length.item()), dtype=torch.uint8, device=self.device)
        self._broadcast(payload)
        return pickle.loads(payload.cpu().numpy().tobytes())


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
