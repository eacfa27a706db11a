"""Run checkpoints: ``<run_dir>/global_step_<N>/`` written atomically, the latest one named in a file.

A checkpoint is built in a hidden temporary folder and renamed into place only when complete, so a
crash during a save leaves the previous checkpoint as the latest loadable one. Layout::

    global_step_12/
        actor/ critic/          written by the workers (weights, optimizer, scheduler, RNG)
        trainer_state.json      step, epoch, dataloader position, controller state
    latest_checkpointed_iteration.txt   "12" (verl's name for it)
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from rlcore.atomic import publish, staging_dir, staging_file
from rlcore.errors import RlcoreError

LATEST = "latest_checkpointed_iteration.txt"
STATE = "trainer_state.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def _write_atomically(path: Path, text: str) -> None:
    staged = staging_file(path)
    with staged.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    publish(staged, path)


class CheckpointManager:
    def __init__(self, run_dir: str | os.PathLike, max_to_keep: int | None = None):
        self.run_dir = Path(run_dir)
        self.max_to_keep = max_to_keep

    def begin(self, step: int) -> Path:
        """A fresh temporary folder to write step ``step`` into; pass it to ``commit``."""
        return staging_dir(self.run_dir / f"global_step_{step}")

    def remove_leftovers(self) -> None:
        """Delete the staging folders of saves that crashed. Only the holder of the run folder's lock
        (``rlcore.runlock``) may call this: any other job's staging folder would be in use."""
        for leftover in self.run_dir.glob(".global_step_*.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def commit(self, staging: Path, step: int, state: dict[str, Any]) -> Path:
        """Write the controller state, move the folder into place, then point ``latest`` at it."""
        _write_atomically(staging / STATE, json.dumps({"global_step": step, **state}, indent=2))
        final = self.run_dir / f"global_step_{step}"
        if final.exists():  # a re-run of the same step replaces it
            shutil.rmtree(final)
        publish(staging, final)
        _write_atomically(self.run_dir / LATEST, str(step))
        self._prune()
        return final

    def abort(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def steps(self) -> list[int]:
        if not self.run_dir.is_dir():
            return []
        found = (_STEP_DIR.match(p.name) for p in self.run_dir.iterdir())
        return sorted(int(m.group(1)) for m in found if m and (self.run_dir / m.group(0) / STATE).is_file())

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        marker = self.run_dir / LATEST
        if marker.is_file():
            text = marker.read_text().strip()
            candidate = self.run_dir / f"global_step_{text}"
            if text.isdigit() and (candidate / STATE).is_file():
                return candidate
        steps = self.steps()  # the marker is missing or stale: fall back to what is complete
        return self.run_dir / f"global_step_{steps[-1]}" if steps else None

    def _prune(self) -> None:
        # Only whole checkpoints: staging folders are removed by abort() and remove_leftovers(),
        # never here, where one could be another writer's save in progress.
        if self.max_to_keep:
            for step in self.steps()[: -self.max_to_keep]:
                shutil.rmtree(self.run_dir / f"global_step_{step}", ignore_errors=True)


def read_state(checkpoint: Path) -> dict[str, Any]:
    path = Path(checkpoint) / STATE
    if not path.is_file():
        raise RlcoreError(f"{checkpoint} is not a complete rlcore checkpoint: {STATE} is missing")
    return json.loads(path.read_text())


def resolve_resume(run_dir: Path, resume_mode: str, resume_from_path: str | None = None) -> Path | None:
    """The checkpoint to resume from for ``trainer.resume_mode``: auto, disable, a path, or verl's
    ``resume_path`` with the path in ``trainer.resume_from_path``."""
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        return CheckpointManager(run_dir).latest()
    key = "trainer.resume_mode"
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise RlcoreError("trainer.resume_mode = 'resume_path' needs trainer.resume_from_path: the "
                              "global_step_N folder to resume from")
        resume_mode, key = resume_from_path, "trainer.resume_from_path"
    path = Path(resume_mode).expanduser()
    if not (path / STATE).is_file():
        raise RlcoreError(
            f"{key} = {resume_mode!r}: not a checkpoint folder (expected {path / STATE}); "
            "use 'auto', 'disable', or the path of a global_step_N folder"
        )
    return path
