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
        self.updated = False  # whether any update of this run went through
        # what else about this run may compute wrong, as the trainer knows it (a limited share of a device
        # under concurrent sharing), each a sentence that says what to change; named first in the error
        self.suspects: list[str] = []

    def check(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """The ``training/nonfinite_steps`` metric; raises once more steps than allowed were skipped."""
        values = {f"{role}/{key}": metrics[f"{role}/{key}"] for role in ROLES for key in WATCHED
                  if f"{role}/{key}" in metrics}
        skipped = any(metrics.get(f"{role}/nonfinite_updates", 0) for role in ROLES) or any(
            not math.isfinite(v) for v in values.values())  # a backend that does not count them
        if not skipped:
            self.updated = True
        else:
            self.steps += 1
            shown = ", ".join(f"{k} = {v:.4g}" for k, v in values.items())
            if self.steps > self.max_steps:
                raise RlcoreError(
                    f"step {step}: the update was skipped because the loss or gradient norm is not finite "
                    f"({shown}); that is {self.steps} such steps, more than trainer.max_nonfinite_steps = "
                    f"{self.max_steps}. {self._advice()}")
            logger.warning("step %d: update skipped, the loss or gradient norm is not finite (%s); %d of %d "
                           "tolerated (trainer.max_nonfinite_steps)", step, shown, self.steps, self.max_steps)
        return {"training/nonfinite_steps": float(self.steps)}

    def _advice(self) -> str:
        """What to change. With no update through yet the weights are the ones loaded, so the learning
        rate cannot be the cause: the forward or backward itself computes non-finite values."""
        suspects = " ".join(self.suspects)
        if not self.updated:
            return ("No update of this run has gone through, so the weights are still the loaded ones and the "
                    "learning rate is not the cause: the forward or backward computes non-finite values on "
                    "these inputs. " + (suspects + " " if suspects else "")
                    + "Check the model (its weights and dtype) and the data.")
        return ((suspects + " " if suspects else "")
                + "Lower actor.optim.lr / critic.optim.lr, or check the rewards and data.")
