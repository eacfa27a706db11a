"""Experiment trackers (``trainer.logger``): ``wandb``, ``tensorboard`` and ``mlflow``, each an extra
(``pip install 'rlcore[wandb]'``, ``rlcore[tensorboard]``, ``rlcore[mlflow]``).

A tracker's run continues when the job resumes: W&B and MLflow keep their run id in the run folder
(``wandb_run_id.txt``, ``mlflow_run_id.txt``), TensorBoard appends event files to ``tensorboard/``.
"""

from __future__ import annotations

import importlib
import os
import re
import time
from pathlib import Path

import attrs

from rlcore.config.schema import JobConfig
from rlcore.errors import RlcoreError
from rlcore.runs.record import _write

WANDB_RUN_ID = "wandb_run_id.txt"
MLFLOW_RUN_ID = "mlflow_run_id.txt"


def _require(module: str, name: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise RlcoreError(f"trainer.logger includes {name!r} but {module} is not installed: "
                          f"pip install 'rlcore[{name}]'") from None


def _kept_id(path: Path, new) -> tuple[str, bool]:
    """The id stored in ``path`` (a resumed run), or a new one written there; and whether it is new."""
    if path.is_file() and path.read_text(encoding="utf-8").strip():
        return path.read_text(encoding="utf-8").strip(), False
    run_id = new()
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, run_id + "\n")
    return run_id, True


def _wandb_id() -> str:
    """Eight lowercase letters and digits, W&B's own form of run id."""
    import secrets
    import string

    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def _numbers(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class WandbLogger:
    """Weights & Biases; project and run names from ``trainer``. ``WANDB_MODE=offline`` writes the run
    under ``<run_dir>/wandb`` for a later ``wandb sync``. A resumed job continues the same W&B run."""

    requires = ("wandb",)  # the modules it imports: checked before a job starts (rlcore.runs.preflight)

    def __init__(self, config: JobConfig, run_dir: Path):
        wandb = _require("wandb", "wandb")
        self.wandb = wandb
        run_id, _ = _kept_id(run_dir / WANDB_RUN_ID, _wandb_id)
        self.run = wandb.init(project=config.trainer.project_name, name=config.trainer.experiment_name,
                              id=run_id, resume="allow", config=attrs.asdict(config, recurse=True),
                              dir=str(run_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_generations(self, records: list[dict], step: int) -> None:
        columns = ["step", "input", "output", "score"]
        table = self.wandb.Table(columns=columns, data=[[step, r["input"], r["output"], r["score"]] for r in records])
        self.run.log({"val/generations": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class TensorboardLogger:
    """TensorBoard event files in ``<run_dir>/tensorboard`` (torch's SummaryWriter)."""

    requires = ("tensorboard",)

    def __init__(self, config: JobConfig, run_dir: Path):
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in _numbers(metrics).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a crash loses no logged step

    def log_generations(self, records: list[dict], step: int) -> None:
        text = "\n\n".join(f"**score {r['score']}**\n\ninput: {r['input']}\n\noutput: {r['output']}"
                           for r in records)
        self.writer.add_text("val/generations", text, step)

    def close(self) -> None:
        self.writer.close()


_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. :/]")


def mlflow_name(key: str) -> str:
    """A metric name MLflow accepts: ``@`` becomes ``_at_`` (as verl does), other characters it refuses ``_``."""
    return _MLFLOW_BAD.sub("_", key.replace("@", "_at_"))


class MlflowLogger:
    """MLflow: experiment ``trainer.project_name``, run ``trainer.experiment_name``. The tracking
    store is ``MLFLOW_TRACKING_URI`` when set, else a local SQLite file ``<run_dir>/mlflow.db``
    (``mlflow ui --backend-store-uri sqlite:///<run_dir>/mlflow.db``). A resumed job continues the
    same MLflow run. Metric names: ``@`` becomes ``_at_``."""

    requires = ("mlflow", "sqlalchemy", "alembic")

    def __init__(self, config: JobConfig, run_dir: Path):
        _require("mlflow", "mlflow")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        trainer = config.trainer
        experiment = self.client.get_experiment_by_name(trainer.project_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(
            trainer.project_name, artifact_location=(run_dir / "mlflow-artifacts").resolve().as_uri())

        def new_run() -> str:
            return self.client.create_run(experiment_id, run_name=trainer.experiment_name,
                                          tags={"rlcore.run_dir": str(run_dir.resolve())}).info.run_id

        self.run_id, created = _kept_id(run_dir / MLFLOW_RUN_ID, new_run)
        if created:  # parameters cannot change once logged: a resumed run keeps its first ones
            params = [Param(k, str(v)[:500]) for k, v in _flat(attrs.asdict(config, recurse=True)).items()]
            for start in range(0, len(params), 100):  # MLflow takes at most 100 per batch
                self.client.log_batch(self.run_id, params=params[start:start + 100])
        else:
            self.client.update_run(self.run_id, status="RUNNING")

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(mlflow_name(k), v, now, step)
                                                    for k, v in _numbers(metrics).items()])

    def log_generations(self, records: list[dict], step: int) -> None:
        import json

        self.client.log_text(self.run_id, "\n".join(json.dumps(r) for r in records),
                             f"generations/step_{step}.jsonl")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(data: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out
