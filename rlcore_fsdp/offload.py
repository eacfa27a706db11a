"""Optimizer offload without parameter offload (``fsdp.optimizer_offload``): AdamW's state lives in
CPU memory between updates and comes back to the device for the update, as verl does, so the
rollout and the log-prob passes run without it. (With ``fsdp.param_offload`` the optimizer already
steps on the CPU and this has nothing to move.)"""

from __future__ import annotations

import torch


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Every state tensor of ``optimizer`` (sharded ones too) onto ``device``."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.device != device and key != "step":
                state[key] = value.to(device)
