"""Checks of a job against this machine (files, folders, disk), run before Ray or any worker starts
and reported together in one pass. ``rlcore config validate`` and ``rlcore train`` run the same
ones, so a job that validates does not fail in the first minute of training for a reason that
needed no GPU to see.

``load_job`` checks the keys and values; these look at what they name.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

from rlcore.config.schema import JobConfig
from rlcore.data.dataset import read_columns
from rlcore.errors import ConfigError
from rlcore.runs.checkpoint import STATE

# A checkpoint holds fp32 weights and AdamW's two moments: about three times the weights' size.
CHECKPOINT_FACTOR = 3
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def run_directory(config: JobConfig) -> Path:
    """``trainer.default_local_dir`` with its ``{project_name}`` and ``{experiment_name}`` filled in."""
    trainer = config.trainer
    try:
        return Path(trainer.default_local_dir.format(project_name=trainer.project_name,
                                                     experiment_name=trainer.experiment_name))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError([f"trainer.default_local_dir = {trainer.default_local_dir!r}: only {{project_name}} and "
                           f"{{experiment_name}} may be filled in (write {{{{ and }}}} for literal braces); "
                           f"{type(exc).__name__}: {exc}"]) from None


def _data_files(config: JobConfig) -> list[str]:
    problems = []
    if not config.data.train_files:
        problems.append("data.train_files: no training data given (a parquet, JSON lines file or folder; "
                        "`rlcore data` prepares some)")
    for key, files in (("data.train_files", config.data.train_files), ("data.val_files", config.data.val_files)):
        for index, name in enumerate(files or ()):
            path = Path(name).expanduser()
            if not path.exists():
                problems.append(f"{key}[{index}] = {name!r}: no such file or folder")
                continue
            for file in sorted(path.glob("*.parquet")) if path.is_dir() else [path]:
                _, problem = read_columns(file, key.split(".")[1].removesuffix("_files"), config.data.prompt_key)
                if problem:  # the schema alone: no rows are read before the job starts
                    problems.append(f"{key}[{index}]: {problem}")
    return problems


def _model(key: str, path: str | None) -> list[str]:
    if not path or path.startswith("embedded:"):
        return []
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return []  # a hub id, or a file: resolve_model_path says which when the model loads
    config = folder / "config.json"
    if not config.is_file():
        return [f"{key} = {path!r}: the folder has no config.json (is it a Hugging Face model folder?)"]
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return [f"{key} = {path!r}: {config} is not valid JSON ({exc})"]
    return []


def checkpoint_estimate(config: JobConfig) -> int:
    """Bytes one checkpoint of the actor (and critic) takes, from the weights on disk; 0 if unknown."""
    total = 0
    for path in {config.model.path, config.critic.model.path}:
        folder = Path(path).expanduser() if path else None
        if folder is not None and folder.is_dir():
            total += sum(p.stat().st_size for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    return total * CHECKPOINT_FACTOR


def _output_folder(config: JobConfig) -> list[str]:
    run_dir = run_directory(config)
    key = f"trainer.default_local_dir ({run_dir})"
    absolute = run_dir.resolve()
    existing = next(p for p in (absolute, *absolute.parents) if p.exists())
    if not existing.is_dir():
        return [f"{key}: {existing} is a file, not a folder"]
    # Probe the nearest folder that exists, so that `config validate` creates nothing; a write is the
    # only test that holds for root, read-only mounts and ACLs alike.
    try:
        probe = existing / f".rlcore-write-test-{os.getpid()}"
        descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(descriptor, b"rlcore")
        finally:
            os.close(descriptor)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        return [f"{key} is not writable: {existing}: {exc.strerror or exc}"]
    needed, free = checkpoint_estimate(config), shutil.disk_usage(existing).free
    if config.trainer.save_freq > 0 and needed > free:
        return [f"{key}: {free / 2**30:.1f} GiB free, less than one checkpoint needs (about {needed / 2**30:.1f} "
                "GiB: the weights and AdamW's two moments)"]
    return []


def _resume(config: JobConfig) -> list[str]:
    trainer = config.trainer
    if trainer.resume_mode in ("auto", "disable"):
        return []
    key, path = ("trainer.resume_from_path", trainer.resume_from_path) if trainer.resume_mode == "resume_path" \
        else ("trainer.resume_mode", trainer.resume_mode)
    if path and not (Path(path).expanduser() / STATE).is_file():
        return [f"{key} = {path!r}: not a checkpoint folder (no {STATE}); use 'auto', 'disable', or the path of "
                "a global_step_N folder"]
    return []


def declared_modules(registered) -> tuple[str, ...]:
    """The modules a registered engine, backend or logger declares it needs (its ``requires``: a
    ``TrainingBackend`` member, an attribute of an engine's factory or a logger's class)."""
    return tuple(getattr(registered, "requires", ()))


def missing_modules(registered) -> list[str]:
    """The modules a registered engine, backend or logger declares in ``requires`` that are not
    installed (looked up, not imported: the library itself may take seconds to import)."""
    missing = []
    for module in declared_modules(registered):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a dotted name whose parent is missing
            found = False
        if not found:
            missing.append(module)
    return missing


def _libraries(config: JobConfig, manager) -> list[str]:
    chosen = [("trainer.backend", "training_backends", config.trainer.backend),
              ("rollout.name", "rollout_engines", config.rollout.name)]
    chosen += [(f"trainer.logger[{i}]", "loggers", name) for i, name in enumerate(config.trainer.logger)]
    problems = []
    for key, kind, name in chosen:
        registry = manager.registry(kind)
        if name not in registry:
            continue  # an unknown name is the key checks' to report
        missing = missing_modules(registry.get(name))
        if missing:
            problems.append(f"{key} = {name!r}: {', '.join(missing)} is not installed "
                            f"(pip install 'rlcore[{name}]')")
    return problems


def _vision_backend(config: JobConfig, manager) -> list[str]:
    """A vision-language model (a local folder with an image processor's settings) on a backend that does not forward
    images: said now, beside a missing library, rather than after that library is installed (the trainer
    says the same, with the data's first image, for a model it finds elsewhere)."""
    from rlcore.data.vision import PREPROCESSOR_CONFIG, has_image_processor
    from rlcore.training.backends import image_forwarding_gap

    folder = Path(config.model.path).expanduser() if config.model.path else None
    gap = image_forwarding_gap(manager, config.trainer.backend)
    if gap is None or folder is None or not folder.is_dir() or not has_image_processor(str(folder)):
        return []  # a hub id or the embedded model: the trainer says it, if its rows have images
    return [f"{gap}, and model.path = {config.model.path!r} is a vision-language model (it has "
            f"{PREPROCESSOR_CONFIG}): train it with one of those"]


def _device_sharing(config: JobConfig) -> list[str]:
    """The colocated form asked to run its kernels side by side where this machine cannot start that (no
    ``nvidia-cuda-mps-control``, a platform without such sharing): said now, not when the trainer starts."""
    section = config.sections.get("async_training")
    if section is None or section.mode != "colocated" or section.device_sharing != "concurrent":
        return []
    from rlcore.runtime.platforms import current_platform  # torch: only for a job that asks

    missing = current_platform().device_sharing_missing()
    return [f"async_training.device_sharing = 'concurrent': {missing}; set device_sharing = 'auto' (it takes "
            "turns then) or 'time_slicing'"] if missing else []


def machine_problems(config: JobConfig, manager=None) -> list[str]:
    """Every problem of the job on this machine; empty when it can run. With the plugin manager,
    also the libraries of the chosen backend, engine and loggers."""
    problems = (_data_files(config) + _model("model.path", config.model.path) + _resume(config)
                + _device_sharing(config))
    if manager is not None:
        problems += _libraries(config, manager) + _vision_backend(config, manager)
    if config.critic.model.path:
        problems += _model("critic.model.path", config.critic.model.path)
    if config.distillation.enable and config.distillation.teacher_path:
        problems += _model("distillation.teacher_path", config.distillation.teacher_path)
    if config.distillation.enable:
        for source, path in config.distillation.teachers.items():
            problems += _model(f"distillation.teachers.{source!r}", path)
    try:
        problems += _output_folder(config)
    except ConfigError as exc:
        problems += exc.problems
    return problems


def preflight(config: JobConfig, source: str | None = None) -> None:
    """Raise one ``ConfigError`` listing every problem ``machine_problems`` finds."""
    problems = machine_problems(config)
    if problems:
        raise ConfigError(problems, source)
