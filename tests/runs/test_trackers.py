"""The trackers against their real libraries: events read back from what each library wrote."""

from __future__ import annotations

import time

import pytest

from rlcore.config import load_job
from rlcore.runs.trackers import MLFLOW_RUN_ID, WANDB_RUN_ID, MlflowLogger, TensorboardLogger, WandbLogger, mlflow_name

KEY = "val-core/openai/gsm8k/reward/mean@1"


def config(**settings):
    return load_job(None, [f"trainer.{k}={v!r}".replace("'", '"') for k, v in settings.items()], check=False).config


def run_twice(logger_class, run_dir):
    """A run logs steps 1-2, stops, and its resumed job logs step 3 into the same run folder."""
    job = config(project_name="proj", experiment_name="exp")
    first = logger_class(job, run_dir)
    first.log({"critic/score/mean": 0.25, KEY: 0.5}, 1)
    first.log({"critic/score/mean": 0.5}, 2)
    first.close()
    second = logger_class(job, run_dir)
    second.log({"critic/score/mean": 0.75, KEY: 1.0}, 3)
    second.close()


def test_tensorboard_event_files_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_twice(TensorboardLogger, tmp_path)
    values = {}
    for events in sorted((tmp_path / "tensorboard").glob("events.out.tfevents.*")):
        reader = EventAccumulator(str(events))
        reader.Reload()
        for tag in reader.Tags()["scalars"]:
            values.setdefault(tag, []).extend((e.step, e.value) for e in reader.Scalars(tag))
    assert sorted(values["critic/score/mean"]) == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert sorted(values[KEY]) == [(1, 0.5), (3, 1.0)]


def test_mlflow_local_store_and_a_resumed_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_twice(MlflowLogger, tmp_path)
    run_id = (tmp_path / MLFLOW_RUN_ID).read_text().strip()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [r.info.run_id for r in client.search_runs([client.get_experiment_by_name("proj").experiment_id])] == [run_id]
    history = client.get_metric_history(run_id, "critic/score/mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert mlflow_name(KEY) == "val-core/openai/gsm8k/reward/mean_at_1"
    assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, mlflow_name(KEY))) == [(1, 0.5), (3, 1.0)]
    run = client.get_run(run_id)
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    assert run.data.params["trainer.project_name"] == "proj" and run.data.params["actor.optim.lr"] == "1e-06"


def leveldb_records(data: bytes):
    """The records of a W&B run file: a 7-byte header (":W&B", magic, version), then LevelDB's log
    format (32 KiB blocks; each record a 7-byte header: crc32, length, type FULL/FIRST/MIDDLE/LAST)."""
    position, pending = 7, b""
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        length, kind = int.from_bytes(data[position + 4:position + 6], "little"), data[position + 6]
        payload = data[position + 7:position + 7 + length]
        position += 7 + length
        if kind == 1:
            yield payload
        elif kind in (2, 3):
            pending = (pending if kind == 3 else b"") + payload
        elif kind == 4:
            yield pending + payload


def wandb_history(run_file):
    """(step, {key: value}) of each history record in an offline W&B run file."""
    import json

    from wandb.proto import wandb_internal_pb2

    rows = []
    for data in leveldb_records(run_file.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            rows.append((items.pop("_step"), {k: v for k, v in items.items() if not k.startswith("_")}))
    return rows


def test_wandb_offline_run_continues_under_the_same_id(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
                        "WANDB_DISABLE_CODE": "true"}.items():
        monkeypatch.setenv(name, value)
    run_twice(WandbLogger, tmp_path)
    run_id = (tmp_path / WANDB_RUN_ID).read_text().strip()
    files = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2 and all(f.name == f"run-{run_id}.wandb" for f in files)  # one W&B run, twice opened
    # W&B's own service process writes the run files and may still be writing the last record when
    # finish() returns on a loaded machine: read until the three steps are there, or 30 s have passed
    deadline = time.monotonic() + 30
    while True:
        history = [row for f in files for row in wandb_history(f)]
        if len(history) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert [(step, row["critic/score/mean"]) for step, row in history] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert history[0][1][KEY] == 0.5 and history[2][1][KEY] == 1.0
