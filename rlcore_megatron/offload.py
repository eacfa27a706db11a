"""Parameter and gradient offload (``megatron.param_offload`` / ``grad_offload``, as verl means them):
between the phases that use them, a role's parameters live in host memory and its gradient buffers
hold no memory at all; a phase that needs them brings them back first.

Megatron's ``DistributedDataParallel`` keeps gradients (and, with the distributed optimizer,
parameters) in contiguous buffers: every parameter's ``data`` and ``main_grad`` are views of them,
and so is the distributed optimizer's shard of an fp32 model. Moving those tensors would leave the
views behind, so their *storage* is emptied instead (``resize_(0)``) and later refilled to its old
size: every view stays the same object and sees the refilled memory. Parameters are copied to host
memory before their storage is emptied and copied back after; gradients are not kept (each update
starts from zeroed gradients), so they come back zeroed. Parameters outside any buffer (the
reference, which has no DDP; every parameter without the distributed optimizer) are handled the
same way, storage by storage, so parameters that share one (tied embeddings) move once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

HOST = torch.device("cpu")


def _bytes_of(storage: torch.UntypedStorage) -> Tensor:
    """A flat uint8 tensor over the whole of ``storage``."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _unique_storages(tensors: Iterable[Tensor]) -> list[torch.UntypedStorage]:
    storages: dict[int, torch.UntypedStorage] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages.setdefault(storage.data_ptr(), storage)
    return list(storages.values())


class ParkedStorage:
    """One device storage whose bytes can be parked in host memory (``keep``) or dropped (gradients)
    and its memory freed, then refilled at its old size."""

    def __init__(self, storage: torch.UntypedStorage, keep: bool):
        self.storage = storage
        self.keep = keep
        self.nbytes = storage.nbytes()
        self.host: Tensor | None = None

    @property
    def resident(self) -> bool:
        return self.storage.nbytes() == self.nbytes

    def park(self) -> None:
        if not self.resident:
            return
        if self.keep:
            if self.host is None:  # allocated once, reused by every later park
                self.host = torch.empty(self.nbytes, dtype=torch.uint8, device=HOST,
                                        pin_memory=self.storage.device.type != "cpu")
            self.host.copy_(_bytes_of(self.storage))
        self.storage.resize_(0)

    def restore(self) -> None:
        if self.resident:
            return
        self.storage.resize_(self.nbytes)
        if self.keep:
            _bytes_of(self.storage).copy_(self.host)
        else:
            _bytes_of(self.storage).zero_()


class ModelOffload:
    """The parameters (``params``) and Megatron DDP's gradient buffers (``grads``) of one role's
    model, parked between phases. ``resident(grads=...)`` brings them back for a phase and parks them
    again after it (nested phases park once, at the outermost exit)."""

    def __init__(self, module: nn.Module, ddp_buffers: Iterable = (), *, params: bool, grads: bool):
        ddp_buffers = list(ddp_buffers)
        self.params: list[ParkedStorage] = []
        self.grads: list[ParkedStorage] = []
        if params:
            buffered = [buffer.param_data for buffer in ddp_buffers if buffer.param_data is not None]
            in_buffers = {id(p) for buffer in ddp_buffers if buffer.param_data is not None for p in buffer.params}
            loose = [p for p in module.parameters() if id(p) not in in_buffers]
            self.params = [ParkedStorage(s, keep=True) for s in _unique_storages(buffered + loose)]
        if grads:
            self.grads = [ParkedStorage(s, keep=False)
                          for s in _unique_storages(buffer.grad_data for buffer in ddp_buffers)]
        self._depth = 0
        self.parks = 0  # how many times the model went to host memory (for logs and tests)

    @property
    def enabled(self) -> bool:
        return bool(self.params or self.grads)

    def park(self) -> None:
        """Parameters to host memory, gradient buffers freed."""
        for parked in self.params + self.grads:
            parked.park()
        self.parks += 1

    @contextmanager
    def resident(self, grads: bool = False) -> Iterator[None]:
        """Parameters (and, with ``grads``, zeroed gradient buffers) on the device for the block."""
        if not self.enabled:
            yield
            return
        for parked in self.params + (self.grads if grads else []):
            parked.restore()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.park()

    def device_bytes(self) -> int:
        """Bytes the parked storages hold on the device now (0 while parked)."""
        return sum(parked.storage.nbytes() for parked in self.params + self.grads)
