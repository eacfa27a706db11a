"""AdamW and the clipped step (the learning-rate schedule is ``rlcore.training.lr_schedule``)."""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from rlcore.api import OptimConfig

log = logging.getLogger(__name__)
SHOWN = 8  # parameters named when gradients are not finite


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the parameters that train (with LoRA, the adapters alone)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(trained, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                             weight_decay=optim.weight_decay)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def nonfinite_gradients(model: nn.Module) -> list[str]:
    """The names of the parameters whose gradient (this rank's shard) holds a NaN or an infinity."""
    names = []
    for name, param in model.named_parameters():
        grad = param.grad
        if grad is not None and not bool(torch.isfinite(grad.to_local() if hasattr(grad, "to_local") else grad).all()):
            names.append(name)
    return names


def _where_nonfinite(model: nn.Module) -> str:
    names = nonfinite_gradients(model)
    if not names:
        return "every gradient on this rank is finite (another rank's shard, or the norm itself, is not)"
    total = sum(1 for p in model.parameters() if p.grad is not None)
    shown = ", ".join(names[:SHOWN]) + (" ..." if len(names) > SHOWN else "")
    return f"non-finite gradients in {len(names)} of {total} parameters: {shown}"


def clip_and_step(model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float, role: str = "model") -> float:
    """Clip the global gradient norm to ``max_norm`` and step; a non-finite norm skips the step
    (as verl), so one overflow cannot poison the weights, and the parameters whose gradients are not
    finite are named in a warning. Returns the norm before clipping."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)  # first, so that a NaN scale never overwrites the gradients
    norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
    if math.isfinite(norm):
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, total)
        optimizer.step()
    else:
        log.warning("%s: gradient norm %s, update skipped; %s", role, norm, _where_nonfinite(model))
    optimizer.zero_grad(set_to_none=True)
    return norm
