"""The learning rate of each training step: linear warmup, then constant or cosine (verl's schedule),
shared by every training backend."""

from __future__ import annotations

import math

import attrs

from rlcore.errors import RlcoreError

# OptimConfig (rlcore.config.schema) is named in a hint, never imported: the configuration stands above this.


@attrs.define
class LrSchedule:
    """The learning rate of each training step (one step = one ``update`` call, as verl).

    Warmup is ``warmup_steps`` steps, or ``warmup_steps_ratio`` of all steps when that is -1; the
    rate rises linearly and reaches ``lr`` on the last warmup step (verl's first step runs at 0).
    Then ``constant``, or ``cosine`` down to ``min_lr`` (when set) or ``min_lr_ratio * lr`` at the last step
    (``num_cycles`` 0.5; other values make that many waves between lr and the floor, as verl's).
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
        floor = self.optim.min_lr / base if self.optim.min_lr is not None else self.optim.min_lr_ratio
        wave = math.cos(2.0 * math.pi * self.optim.num_cycles * progress)  # num_cycles 0.5: cos(pi * progress)
        return base * (floor + (1.0 - floor) * 0.5 * (1.0 + wave))

    def state_dict(self) -> dict:
        return {"step": self.step, "total_steps": self.total_steps}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.total_steps = state["total_steps"] if self.total_steps is None else self.total_steps


# --- the job's checks of [actor.optim] and [critic.optim] (registered by rlcore.builtins) ------------


def _optimizers(config):
    return (("actor.optim", config.actor.optim), ("critic.optim", config.critic.optim))


def schedule_problems(job) -> list[str]:
    return [f"{section}.min_lr ({optim.min_lr}) is the floor the cosine schedule decays to: it cannot be above "
            f"{section}.lr ({optim.lr})"
            for section, optim in _optimizers(job.config) if optim.min_lr is not None and optim.min_lr > optim.lr]


def schedule_unused(job) -> list[str]:
    why = {"min_lr": "it is the cosine schedule's floor", "min_lr_ratio": "it is the cosine schedule's floor",
           "num_cycles": "it shapes the cosine schedule"}
    return [f"{key} has no effect while {section}.lr_scheduler is 'constant' ({why[key.rpartition('.')[2]]})"
            for section, optim in _optimizers(job.config) if optim.lr_scheduler == "constant"
            for key in job.given(f"{section}.min_lr") + job.given(f"{section}.min_lr_ratio")
            + job.given(f"{section}.num_cycles")]
