"""AdamW, its learning-rate schedule (linear warmup, then constant or cosine) and the clipped step."""

from __future__ import annotations

import math

import attrs
import torch
from torch import nn

from rlcore.config.schema import OptimConfig
from rlcore.errors import RlcoreError


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=tuple(optim.betas),
                             weight_decay=optim.weight_decay)


@attrs.define
class LrSchedule:
    """The learning rate of each training step (one step = one ``update`` call, as verl).

    Warmup is ``warmup_steps`` steps, or ``warmup_steps_ratio`` of all steps when that is -1; the
    rate rises linearly and reaches ``lr`` on the last warmup step (verl's first step runs at 0).
    Then ``constant``, or ``cosine`` down to ``min_lr_ratio * lr`` at the last step.
    """

    optim: OptimConfig
    section: str  # "actor.optim", for messages
    total_steps: int | None = None
    step: int = 0

    def warmup(self) -> int:
        if self.optim.warmup_steps >= 0:
            return self.optim.warmup_steps
        if self.optim.warmup_steps_ratio == 0:
            return 0
        return int(self.optim.warmup_steps_ratio * self._total("warmup_steps_ratio"))

    def _total(self, why: str) -> int:
        if self.total_steps is None:
            raise RlcoreError(f"{self.section}.{why} needs the number of training steps, which the "
                              "trainer passes with set_total_steps(n) before the first update")
        return self.total_steps

    def lr(self) -> float:
        warmup, step, base = self.warmup(), self.step, self.optim.lr
        if step < warmup:
            return base * (step + 1) / warmup
        if self.optim.lr_scheduler == "constant":
            return base
        total = self._total("lr_scheduler = 'cosine'")
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        floor = self.optim.min_lr_ratio
        return base * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))

    def state_dict(self) -> dict:
        return {"step": self.step, "total_steps": self.total_steps}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.total_steps = state["total_steps"] if self.total_steps is None else self.total_steps


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
