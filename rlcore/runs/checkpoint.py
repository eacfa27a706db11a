"""Run checkpoints: ``<run_dir>/global_step_<N>/`` written atomically, the latest one named in a file.

A checkpoint is built in a hidden temporary folder and renamed into place only when complete, so a
crash during a save leaves the previous checkpoint as the latest loadable one. Layout::

    global_step_12/
        actor/ critic/          written by the workers (weights, optimizer, scheduler, RNG)
        trainer_state.json      step, epoch, dataloader position, controller state
        manifest.json           every other file's size and sha256, written last
    latest_checkpointed_iteration.txt   "12" (verl's name for it)

The manifest is what makes a checkpoint trustworthy after the fact: a shard truncated by a full
disk, a file emptied by a crash or edited by hand shows as a mismatch, named with its step, and
resume falls back to the newest checkpoint that verifies. (Checkpoints from before manifests are
accepted as they are.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from rlcore.errors import RlcoreError
from rlcore.runtime.atomic import publish, staging_dir, staging_file

LATEST = "latest_checkpointed_iteration.txt"
STATE = "trainer_state.json"
MANIFEST = "manifest.json"
PARTS = ("model", "optimizer", "extra", "hf_model")  # what a role's checkpoint may hold (verl's save_contents)
logger = logging.getLogger(__name__)
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
        (``rlcore.runs.lock``) may call this: any other job's staging folder would be in use."""
        for leftover in self.run_dir.glob(".global_step_*.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def commit(self, staging: Path, step: int, state: dict[str, Any]) -> Path:
        """Write the controller state, move the folder into place, then point ``latest`` at it."""
        try:
            _write_atomically(staging / STATE, json.dumps({"global_step": step, **state}, indent=2))
            write_manifest(staging)  # last: it vouches for everything above
        except OSError as exc:  # a full or read-only disk: say which save failed, and that nothing was lost
            previous = self.steps()
            kept = f"the checkpoint of step {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
            raise RlcoreError(f"saving the checkpoint of step {step} into {self.run_dir} failed: "
                              f"{exc.strerror or exc} ({exc.filename or staging}); {kept}") from exc
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

    def latest_intact(self) -> Path | None:
        """The newest checkpoint that verifies, saying which newer ones were skipped and why."""
        for step in reversed(self.steps()):
            candidate = self.run_dir / f"global_step_{step}"
            problem = verify_checkpoint(candidate)
            if problem is None:
                return candidate
            logger.warning("checkpoint %s (step %d) is damaged: %s; falling back to an earlier checkpoint",
                           candidate, step, problem)
        if self.steps():
            raise RlcoreError(f"no intact checkpoint in {self.run_dir}: every global_step_N folder is damaged "
                              "(see the warnings above). Set trainer.resume_mode = 'disable' to start over, or "
                              "move the run folder aside.")
        return None

    def _prune(self) -> None:
        # Only whole checkpoints: staging folders are removed by abort() and remove_leftovers(),
        # never here, where one could be another writer's save in progress.
        if self.max_to_keep:
            for step in self.steps()[: -self.max_to_keep]:
                shutil.rmtree(self.run_dir / f"global_step_{step}", ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """``manifest.json``: each file under ``folder`` (relative path, size, sha256)."""
    files = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}
    _write_atomically(folder / MANIFEST, json.dumps({"format": 1, "files": files}, indent=1))


def verify_checkpoint(checkpoint: Path) -> str | None:
    """What is wrong with a checkpoint folder, naming the file; None when it verifies."""
    checkpoint = Path(checkpoint)
    manifest_path = checkpoint / MANIFEST
    if manifest_path.is_file():
        try:
            files = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return f"{manifest_path} is damaged (not the JSON rlcore wrote)"
        for name, expected in files.items():
            path = checkpoint / name
            if not path.is_file():
                return f"{path} is missing"
            size = path.stat().st_size
            if size != expected["size"]:
                return f"{path} is {size} bytes where the manifest says {expected['size']} (truncated or overwritten)"
            if _sha256(path) != expected["sha256"]:
                return f"{path} does not match its sha256 in the manifest (its content changed)"
    try:
        read_state(checkpoint)
    except RlcoreError as exc:
        return str(exc)
    return None


def read_state(checkpoint: Path) -> dict[str, Any]:
    path = Path(checkpoint) / STATE
    if not path.is_file():
        raise RlcoreError(f"{checkpoint} is not a complete rlcore checkpoint: {STATE} is missing")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RlcoreError(f"{path} is not valid JSON ({exc}): the file is damaged or half-written") from None
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        raise RlcoreError(f"{path} does not hold a trainer state (no integer global_step)")
    return state


def verified(checkpoint: Path, key: str) -> Path:
    """``checkpoint``, or an error naming the damaged file when it does not verify."""
    problem = verify_checkpoint(checkpoint)
    if problem is not None:
        raise RlcoreError(f"{key}: checkpoint {checkpoint} is damaged: {problem}")
    return checkpoint


def resolve_resume(run_dir: Path, resume_mode: str, resume_from_path: str | None = None) -> Path | None:
    """The checkpoint to resume from for ``trainer.resume_mode``: auto, disable, a path, or verl's
    ``resume_path`` with the path in ``trainer.resume_from_path``."""
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        return CheckpointManager(run_dir).latest_intact()
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
    return verified(path, key)  # a named checkpoint is not silently swapped for another


# --- the job's checks of the checkpoint settings (registered by rlcore.builtins) ---------------------


def checkpoint_problems(job) -> list[str]:
    """A role's checkpoint holds parts rlcore knows, and its weights: a resume starts from them."""
    problems = []
    for role in ("actor", "critic"):
        contents = getattr(job.config, role).checkpoint.save_contents
        unknown = [part for part in contents if part not in PARTS]
        if unknown:
            problems.append(f"{role}.checkpoint.save_contents: unknown part(s) {unknown}; expected some of "
                            f"{list(PARTS)}")
        elif "model" not in contents:
            problems.append(f"{role}.checkpoint.save_contents = {list(contents)} has no 'model': an rlcore checkpoint "
                            "is what a run resumes from, and it cannot resume without the weights (for a Hugging "
                            "Face folder, `rlcore export` a checkpoint)")
    return problems


def checkpoint_unused(job) -> list[str]:
    if job.config.trainer.resume_mode == "resume_path":
        return []
    return [f"{key} has no effect unless trainer.resume_mode = 'resume_path'" for key in job.given("trainer.resume_from_path")]
