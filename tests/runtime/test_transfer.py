"""``rlcore.runtime.transfer.to_device``: every training backend's host-to-device copy of a micro-batch
(through pinned memory on an accelerator, so that the host does not wait; tests/fsdp/test_on_device.py
checks that under CUDA's sync debug mode)."""

from __future__ import annotations

import torch

from rlcore.runtime.transfer import to_device


def test_to_device_leaves_a_tensor_already_there_and_moves_it_otherwise():
    values = torch.arange(6).view(2, 3)
    assert to_device(values, torch.device("cpu")) is values
    moved = to_device(values, torch.device("meta"))
    assert moved.device.type == "meta" and moved.shape == values.shape


def test_third_party_backends_find_it_in_the_api():
    import rlcore.api

    assert rlcore.api.to_device is to_device and "to_device" in rlcore.api.__all__
