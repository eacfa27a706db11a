"""Stopping a run whose numbers stopped being numbers.

Backends skip an optimizer step whose loss or gradient norm is not finite (one overflow must not
poison the weights) and count it in ``<role>/nonfinite_updates``. ``NonFiniteGuard`` counts the
steps where that happened and stops the run past ``trainer.max_nonfinite_steps``, naming the step
and the values: a run that skips every update trains nothing, and should not look like it trains.
"""

from __future__ import annotations

import logging
import math

from rlcore.errors import RlcoreError

logger = logging.getLogger(__name__)
ROLES = ("actor", "critic")
# the values that show why an update was skipped, where a backend reports them
WATCHED = ("pg_loss", "vf_loss", "kl_loss", "entropy", "grad_norm")


class NonFiniteGuard:
    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self.steps = 0  # steps of this run with a skipped update

    def check(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """The ``training/nonfinite_steps`` metric; raises once more steps than allowed were skipped."""
        values = {f"{role}/{key}": metrics[f"{role}/{key}"] for role in ROLES for key in WATCHED
                  if f"{role}/{key}" in metrics}
        skipped = any(metrics.get(f"{role}/nonfinite_updates", 0) for role in ROLES) or any(
            not math.isfinite(v) for v in values.values())  # a backend that does not count them
        if skipped:
            self.steps += 1
            shown = ", ".join(f"{k} = {v:.4g}" for k, v in values.items())
            if self.steps > self.max_steps:
                raise RlcoreError(
                    f"step {step}: the update was skipped because the loss or gradient norm is not finite "
                    f"({shown}); that is {self.steps} such steps, more than trainer.max_nonfinite_steps = "
                    f"{self.max_steps}. Lower actor.optim.lr / critic.optim.lr, or check the rewards and data.")
            logger.warning("step %d: update skipped, the loss or gradient norm is not finite (%s); %d of %d "
                           "tolerated (trainer.max_nonfinite_steps)", step, shown, self.steps, self.max_steps)
        return {"training/nonfinite_steps": float(self.steps)}
