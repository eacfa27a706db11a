"""The run folder's record: run.toml, overrides.txt, environment.json, changed keys, metrics.jsonl cut back."""

from __future__ import annotations

import json

import torch

from rlcore.api import RolloutEngine, hookimpl
from rlcore.config import load_job
from rlcore.config.dump import to_toml
from rlcore.config.load import read_toml
from rlcore.plugins.manager import PluginManager
from rlcore.runs.loggers import JsonlLogger
from rlcore.runs.record import changed_keys, cut_metrics, environment, previous_record, write_record
from rlcore.runtime.platforms import CpuPlatform


def test_record_holds_the_job_the_overrides_and_the_versions(tmp_path):
    overrides = ["actor.optim.lr=3e-6", "trainer.total_training_steps=7"]
    job = load_job(None, overrides, check=False)
    env = environment(CpuPlatform(), "hf", "fsdp")
    assert previous_record(tmp_path) is None  # a new run folder
    write_record(tmp_path, to_toml(job.config), None, job.overrides, env)

    # run.toml loads back as the same job
    again = load_job(tmp_path / "run.toml", check=False)
    assert again.config == job.config and again.config.actor.optim.lr == 3e-6
    assert (tmp_path / "overrides.txt").read_text().splitlines() == ["# no job file", *overrides]
    written = json.loads((tmp_path / "environment.json").read_text())
    assert written["versions"]["torch"] == torch.__version__.split("+")[0] or \
        written["versions"]["torch"] == torch.__version__
    assert "rlcore" in written["versions"] and "transformers" in written["versions"]
    assert written["machine"]["device_type"] == "cpu" and written["machine"]["device_count"] == 1
    assert len(written["machine"]["devices"]) == 1 and (written["engine"], written["backend"]) == ("hf", "fsdp")


def test_a_second_start_names_each_changed_key(tmp_path):
    first = load_job(None, ["actor.optim.lr=3e-6", "trainer.total_training_steps=7"], check=False)
    write_record(tmp_path, to_toml(first.config), None, first.overrides, {})
    second = load_job(None, ["actor.optim.lr=1e-5", "trainer.total_training_steps=7", "rollout.n=4"], check=False)
    changes = changed_keys(previous_record(tmp_path), to_toml(second.config))
    write_record(tmp_path, to_toml(second.config), None, second.overrides, {})
    assert changes == ["actor.optim.lr: 3e-06 -> 1e-05", "rollout.n: 1 -> 4"]
    assert read_toml(tmp_path / "run.toml")["rollout"]["n"] == 4  # the record is the new job


def test_changed_keys_reports_keys_that_appear_or_go():
    assert changed_keys("a = 1\n[b]\nc = 2\n", "a = 1\n[b]\nd = 'x'\n") == ["b.c: 2 -> unset", "b.d: unset -> 'x'"]


def _steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_metrics_are_cut_back_to_the_resumed_step(tmp_path):
    logger = JsonlLogger(None, tmp_path)
    for step in (0, 1, 2, 3, 4):  # a crash after step 4, the last checkpoint at step 2
        logger.log({"x": float(step)}, step)
    logger.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "x":')  # torn by the crash
    assert cut_metrics(tmp_path, 2) == 3
    assert _steps(tmp_path / "metrics.jsonl") == [0, 1, 2]
    logger = JsonlLogger(None, tmp_path)  # the resumed run continues the file
    logger.log({"x": 3.5}, 3)
    logger.close()
    assert _steps(tmp_path / "metrics.jsonl") == [0, 1, 2, 3]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging file left


def test_a_fresh_start_empties_the_metrics_of_an_earlier_run(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    assert cut_metrics(tmp_path, 0) == 2
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert cut_metrics(tmp_path / "nothing-here", 3) == 0


class NeedsPluggy:
    """An engine whose factory declares the library it needs, as the vllm and sglang plugins' do."""

    @hookimpl
    def rlcore_register_rollout_engines(self, register):
        def engine(config, platform, actor):
            raise AssertionError("not built in this test")

        register("needs-pluggy", RolloutEngine(engine, requires=("pluggy",)))


def test_the_chosen_engines_declared_library_is_recorded_with_its_version():
    import pluggy

    manager = PluginManager(plugins={"needs": NeedsPluggy()})
    chosen = environment(CpuPlatform(), "needs-pluggy", "fsdp", manager)["versions"]
    assert chosen["pluggy"] == pluggy.__version__
    assert "pluggy" not in environment(CpuPlatform(), "hf", "fsdp", manager)["versions"]
