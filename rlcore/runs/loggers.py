"""Metric loggers (``trainer.logger``). Every run also writes ``metrics.jsonl`` in its run directory.

A logger factory is registered by name: ``factory(config: JobConfig, run_dir: Path) -> Logger``.
A logger may also show generations (``log_generations``, for ``trainer.log_val_generations``):
records with ``input``, ``output`` and ``score`` (``rlcore.runs.generations``); one without the method
is skipped.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Protocol

from rlcore.config.schema import JobConfig, TrainerConfig
from rlcore.metrics.progress import ProgressLine, number


class Logger(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    # optional: def log_generations(self, records: list[dict], step: int) -> None
    # optional: def begin(self, total_steps: int, step: int) -> None  (before the first step this process runs)

    def close(self) -> None: ...


class ConsoleLogger:
    """One compact line per step (``rlcore.metrics.progress``): ``step 12/300 | 23.1 s/step | eta ... | score ...``,
    the same on a terminal and in a log file; the metrics shown are ``trainer.console_metrics``."""

    def __init__(self, config: JobConfig | None, run_dir: Path | None, stream=None):
        keys = config.trainer.console_metrics if config is not None else TrainerConfig().console_metrics
        self.stream = stream or sys.stdout
        self.progress = ProgressLine(tuple(keys))

    def begin(self, total_steps: int, step: int) -> None:
        self.progress.begin(total_steps, step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        print(self.progress.line(metrics, step), file=self.stream, flush=True)

    def log_generations(self, records: list[dict], step: int) -> None:
        lines = [f"validation generations at step {step} ({len(records)} shown):"]
        for index, record in enumerate(records, 1):
            lines += [f"[{index}] score {number(record['score'])}", f"input: {record['input']}",
                      f"output: {record['output']}"]
        print("\n".join(lines), file=self.stream, flush=True)

    def close(self) -> None:
        return None


class JsonlLogger:
    """Appends ``{"step": n, ...metrics}`` lines to ``metrics.jsonl``; resumed runs continue the file."""

    def __init__(self, config: JobConfig, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self.file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self.file.write(json.dumps({"step": step, **clean}, sort_keys=True) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class MultiLogger:
    def __init__(self, loggers: list[Logger]):
        self.loggers = loggers

    def begin(self, total_steps: int, step: int) -> None:
        for logger in self.loggers:
            if hasattr(logger, "begin"):
                logger.begin(total_steps, step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def log_generations(self, records: list[dict], step: int) -> None:
        for logger in self.loggers:
            if hasattr(logger, "log_generations"):
                logger.log_generations(records, step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
