"""The weight bridge: a ``torch.distributed`` process group of its own between a trainer worker (bridge
rank 0) and rollout workers (ranks 1..), over which new weights go bucket by bucket. Three routes:

- ``collectives``: each bucket broadcast over the device's collectives (gloo on the CPU, NCCL on GPUs):
  the split form's trainer rank 0 to every rollout worker, on devices of their own.
- ``lent``: the colocated form, sender and receiver on one node and one device: the sender lends
  each bucket's memory (``Platform.share_with_processes``: CUDA IPC on GPUs, a shared-memory segment
  on the CPU), the receivers map it and copy it out on their device, and an acknowledgement over gloo
  ends the loan. Only the headers and handles travel through the group.
- ``host``: the colocated form where the platform cannot lend memory: gloo on CPU tensors (one copy of
  each bucket to and from host memory; NCCL refuses two ranks on one device).

It is built from a ``TCPStore`` and the platform's process-group class directly
(``Platform.side_process_group``), beside each process's default group (the trainer's ranks keep
theirs for their training backend, the rollout pool its own): a process may hold one default group
only. Each bucket travels as a header (names, shapes, dtypes and, on the lent route, the handle;
pickled) and, on the other routes, one flat byte tensor; an empty header ends a sync.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from rlcore.errors import RlcoreError
from rlcore.runtime.rendezvous import store_at

Bucket = list[tuple[str, torch.Tensor]]
STORE_PREFIX = "rlcore-weight-bridge"
ROUTES = ("collectives", "lent", "host")


def colocated_route(platform) -> str:
    """The colocated form's route on ``platform``: ``lent`` where it lends memory between processes."""
    return "lent" if platform.lends_memory else "host"


class WeightBridge:
    def __init__(self, address: str, rank: int, world_size: int, platform, device: torch.device,
                 timeout_s: float = 1800.0, route: str = "collectives"):
        if route not in ROUTES:
            raise RlcoreError(f"internal: weight bridge route {route!r}, expected one of {', '.join(ROUTES)}")
        timeout = timedelta(seconds=timeout_s)
        store = store_at(address, rank, world_size, timeout)
        prefixed = dist.PrefixStore(STORE_PREFIX, store)
        if route == "collectives":
            self.group = platform.side_process_group(prefixed, rank, world_size, timeout)
        else:  # control messages (and, through the host, the bytes) over gloo on host tensors
            self.group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        self.device = device if route == "collectives" else torch.device("cpu")  # where the group's tensors live
        self.tensor_device = device if route != "host" else torch.device("cpu")  # where received tensors land
        self.landed_on_host = False  # the device had no room for a received bucket: host memory from then on
        self.store = store  # kept alive: the group rendezvoused through it
        self.platform, self.route = platform, route
        self.rank, self.world_size = rank, world_size

    def send(self, buckets: Iterator[Bucket]) -> int:
        """Send every bucket (rank 0); returns the bytes sent."""
        sent = 0
        for bucket in buckets:
            header = [(name, tuple(t.shape), t.dtype) for name, t in bucket]
            flat = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in bucket])
            if self.route == "lent":
                handle, end_loan = self.platform.share_with_processes(flat)
                del flat  # lent: the loan holds it
                try:
                    self._broadcast_object((header, handle))
                    self._acknowledge()  # every receiver has copied the bucket out
                finally:  # also when a receiver died: no segment outlives the sync
                    end_loan()
            else:
                self._broadcast_object((header, None))
                self._broadcast(flat.to(self.device))
            sent += sum(_numel(shape) * dtype.itemsize for _, shape, dtype in header)
        self._broadcast_object(None)
        return sent

    def receive(self) -> Iterator[Bucket]:
        """The buckets rank 0 sends, each as it arrives (ranks 1..), every tensor in a storage of its
        own on ``tensor_device``; ends with the sync."""
        while (message := self._broadcast_object(None)) is not None:
            header, handle = message
            if self.route == "lent":
                with self.platform.open_shared(handle) as lent:
                    bucket = self._land(lent, header)
                    del lent  # the mapping ends with the block
                self._acknowledge()
            else:
                flat = torch.empty(sum(_sizes(header)), dtype=torch.uint8, device=self.device)
                self._broadcast(flat)
                bucket = self._land(flat, header)
            yield bucket

    def close(self) -> None:
        self.group = None
        self.store = None

    # -- pieces ----------------------------------------------------------------------------------
    def _land(self, flat: torch.Tensor, header) -> Bucket:
        """The bucket's tensors out of ``flat`` on ``tensor_device``; where the device has no room for them
        (an engine beside a trainer on a full card), in host memory, for this and every later bucket: the
        receiver moves each to the device as its engine loads it."""
        bucket, self.tensor_device = landed(flat, header, self.tensor_device)
        self.landed_on_host |= self.tensor_device.type == "cpu" and flat.device.type != "cpu"
        return bucket

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def _acknowledge(self) -> None:
        """Every rank at this point: the receivers have copied out what the sender lent."""
        self.group.allreduce([torch.zeros(1, dtype=torch.int32)]).wait()

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


def _sizes(header) -> list[int]:
    return [_numel(shape) * dtype.itemsize for _, shape, dtype in header]


def landed(flat: torch.Tensor, header, device: torch.device) -> tuple[Bucket, torch.device]:
    """(the header's tensors out of ``flat`` on ``device``, ``device``), or on the host, with the host, where
    ``device`` is out of memory."""
    try:
        return _split(flat, header, device), device
    except torch.OutOfMemoryError:
        if device.type == "cpu":
            raise
    host = torch.device("cpu")
    return _split(flat, header, host), host


def _split(flat: torch.Tensor, header, device: torch.device) -> Bucket:
    """The header's tensors out of ``flat``, each copied to a storage of its own on ``device`` (a view of
    another dtype needs an aligned offset; a lent buffer must not be kept)."""
    bucket, offset = [], 0
    for (name, shape, dtype), size in zip(header, _sizes(header)):
        copied = flat[offset:offset + size].to(device, copy=True)
        bucket.append((name, copied.view(dtype).reshape(shape)))
        offset += size
    return bucket


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
