"""Host-to-device copies that do not make the host wait for the device.

A plain ``tensor.to("cuda")`` from pageable host memory synchronizes the stream first: the host waits for
every kernel already queued before it copies, so each micro-batch's inputs drained the queue. On one GPU
shared with the engine that wait is long (the kernels run in time slices) and leaves the trainer's share
idle until the host queues again (docs/async.md, the 1.5B trace). From pinned memory the copy is queued
like a kernel, in order on the stream, and the host goes on. Every training backend copies its
micro-batches with ``to_device`` (``rlcore.api`` exports it for third-party ones).
"""

from __future__ import annotations

import torch
from torch import Tensor


def to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` on ``device``; a host tensor bound for the machine's accelerator goes through pinned memory
    without waiting (the pinned copy is the caching host allocator's, kept until the copy has run)."""
    if tensor.device == device:
        return tensor
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if tensor.device.type == "cpu" and accelerator is not None and device.type == accelerator.type:
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
