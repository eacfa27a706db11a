"""AdamW and the clipped step (the learning-rate schedule is ``rlcore.lr_schedule``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from rlcore.api import OptimConfig


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the parameters that train (with LoRA, the adapters alone)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(trained, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_and_step(model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float) -> float:
    """Clip the global gradient norm to ``max_norm`` and step; a non-finite norm skips the step
    (as verl), so one overflow cannot poison the weights. Returns the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if math.isfinite(norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm
