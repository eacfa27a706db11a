"""What a person reads while a run goes and when it ends: one compact line per step and a summary.

The line is plain text, the same on a terminal and in a log file (``ray job submit``, nohup, SLURM):
``step 12/300 | 23.1 s/step | eta 1:52:10 | score 0.412 | length 87.2 | kl 0.0012 | entropy 0.53 | gen 62%``.
Its metrics are ``trainer.console_metrics`` (those a step has); every metric still goes to
metrics.jsonl and the trackers.
"""

from __future__ import annotations

import math
import time

# Short labels for the usual headline metrics; any other key is shown under its own name.
LABELS = {
    "critic/score/mean": "score",
    "critic/rewards/mean": "reward",
    "response_length/mean": "length",
    "actor/kl_loss": "kl",
    "actor/reward_kl_penalty": "kl",
    "actor/ppo_kl": "ppo_kl",
    "actor/entropy": "entropy",
    "actor/pg_loss": "pg_loss",
    "timing_share/gen": "gen",
}
SHARES = ("timing_share/",)  # fractions shown as percentages


def duration(seconds: float) -> str:
    """``42s``, ``3:05`` or ``1:52:10``."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}" if minutes else f"{secs}s"


def number(value) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    return str(int(value)) if isinstance(value, float) else str(value)


def _metric(key: str, value) -> str:
    label = LABELS.get(key, key)
    if key.startswith(SHARES) and isinstance(value, (int, float)):
        return f"{label} {value:.0%}"
    return f"{label} {number(value)}"


def validation_keys(metrics: dict) -> list[str]:
    """The headline validation metrics of a step: each data source's mean@N under val-core/."""
    return sorted(k for k in metrics if k.startswith("val-core/") and "/mean@" in k)


class ProgressLine:
    """Formats one step's line; its clock starts at ``begin`` (after any resume) and again after the
    validation before training, so s/step and the time left count only steps this process ran."""

    def __init__(self, keys: tuple[str, ...], clock=time.monotonic):
        self.keys, self.clock = keys, clock
        self.total: int | None = None
        self.first_step, self.started = 0, clock()

    def begin(self, total_steps: int, step: int) -> None:
        self.total, self.first_step, self.started = total_steps, step, self.clock()

    def line(self, metrics: dict, step: int) -> str:
        parts = [f"step {step}/{self.total}" if self.total else f"step {step}"]
        done = step - self.first_step
        if done > 0:
            per_step = (self.clock() - self.started) / done
            parts.append(f"{per_step:.3g} s/step")
            if self.total:
                parts.append(f"eta {duration(per_step * max(self.total - step, 0))}")
        elif step == 0 or step == self.first_step:
            parts.append("validation" if validation_keys(metrics) else "start")
            self.started = self.clock()  # the steps' pace starts after the validation before training
        parts += [_metric(k, metrics[k]) for k in self.keys if k in metrics]
        parts += [f"{k} {number(metrics[k])}" for k in validation_keys(metrics) if k not in self.keys]
        return " | ".join(parts)


def summary(steps: int, total: int, wall_seconds: float, validations: list[tuple[int, dict]],
            checkpoint, export_command: str | None) -> str:
    """The end of a run: steps, wall time, best and last validation of each headline validation
    metric, the last checkpoint and how to export it."""
    lines = [f"run finished: {steps}/{total} steps in {duration(wall_seconds)}"]
    keys = sorted({k for _, m in validations for k in validation_keys(m)})
    for key in keys:
        seen = [(step, m[key]) for step, m in validations if isinstance(m.get(key), (int, float))]
        best = max(seen, key=lambda s: s[1])
        lines.append(f"  {key}: last {number(seen[-1][1])} (step {seen[-1][0]}), best {number(best[1])} "
                     f"(step {best[0]})")
    if not keys:
        lines.append("  no validation (set data.val_files and trainer.test_freq)")
    if checkpoint is None:
        lines.append("  no checkpoint saved (trainer.save_freq = -1)")
    else:
        lines.append(f"  checkpoint: {checkpoint}")
        lines.append(f"  export: {export_command}" if export_command
                     else "  export: this backend has no `rlcore export`; the checkpoint is its own format")
    return "\n".join(lines)
