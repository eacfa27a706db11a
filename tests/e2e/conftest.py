"""Whole training jobs on a tiny model and a slice of GSM8K, through the real CLI and FSDP2; under Ray where
Ray is what a test is about."""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from tests.conftest import SHARED, require_shared, run_rlcore

GSM8K = SHARED / "data" / "gsm8k"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")


@pytest.fixture(scope="session")
def gsm8k_parquet(tmp_path_factory) -> Path:
    """train.parquet (16 problems) and test.parquet (4) made by ``rlcore data gsm8k --input``."""
    require_shared(GSM8K / "train.jsonl", "GSM8K")
    root = tmp_path_factory.mktemp("gsm8k")
    out = root / "parquet"
    for split, count in (("train", 16), ("test", 4)):
        with open(GSM8K / f"{split}.jsonl") as src, open(root / f"{split}.jsonl", "w") as dst:
            dst.writelines(itertools.islice(src, count))
    for split in ("train", "test"):
        result = run_rlcore("data", "gsm8k", "--local-save-dir", str(out), "--input", str(root / f"{split}.jsonl"))
        assert result.returncode == 0, result.stderr
    assert (out / "train.parquet").is_file() and (out / "test.parquet").is_file()
    return out


# A tiny random model never answers a GSM8K problem nor counts shapes right: a reward that the samples of one
# prompt do not all share gives GRPO advantages, updates and so a policy that moves between versions.
PARITY_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(len(solution_str) % 2)
"""


def parity_reward(tmp_path) -> list[str]:
    path = tmp_path / "parity_reward.py"
    path.write_text(PARITY_REWARD)
    return [f"reward.custom_reward_function.path={path}"]


def job_overrides(model: Path, data: Path, run_dir: Path, **extra) -> list[str]:
    """A job sized for a tiny model on a 2-core CPU."""
    settings = {
        "model.path": str(model),
        "data.train_files": str(data / "train.parquet"),
        "data.val_files": str(data / "test.parquet"),
        "data.train_batch_size": 4,
        "data.max_prompt_length": 512,
        "data.max_response_length": 16,
        "data.filter_overlong_prompts": True,
        "actor.ppo_mini_batch_size": 2,
        "actor.ppo_micro_batch_size_per_gpu": 2,
        "actor.optim.lr": 1e-4,
        "critic.optim.lr": 1e-4,
        "trainer.total_training_steps": 2,
        "trainer.test_freq": 2,
        "trainer.save_freq": 1,
        "trainer.logger": "console",
        "trainer.default_local_dir": str(run_dir),
        "trainer.n_gpus_per_node": 1,
    } | extra
    return [f"{k}={_literal(v)}" for k, v in settings.items()]


def _literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def read_metrics(run_dir: Path) -> list[dict]:
    """The job's metrics, one dict per logged step; every value is checked to be a finite number
    (the jsonl logger writes a NaN or an infinity as null)."""
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in metrics:
        bad = {k: v for k, v in record.items() if not isinstance(v, (int, float)) or not math.isfinite(v)}
        assert not bad, f"non-finite metrics at step {record.get('step')} of the job in {run_dir}: {bad}"
    return metrics


def checkpoint_tensors(role_folder: Path, scratch: Path) -> dict:
    """Everything a role's checkpoint holds (weights "model.<name>", AdamW state), read back from its
    shards in this process, without a process group."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    scratch.parent.mkdir(parents=True, exist_ok=True)
    dcp_to_torch_save(str(role_folder / "shards"), str(scratch))
    return torch.load(scratch, weights_only=False)


def model_weights(model_dir: Path) -> dict:
    """A Hugging Face model folder's parameters, by name."""
    from transformers import AutoModelForCausalLM

    return {name: p.detach() for name, p in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()}


def train(*overrides: str, timeout: float, ray: bool = False, site: Path | None = None) -> subprocess.CompletedProcess:
    """``rlcore train`` with these overrides, its status and output as a finished process's. Without ``ray``
    and ``site`` it runs in this process, its one worker too (``trainer.ray = false``): a fresh process
    would pay the imports of torch, transformers and rlcore, and the model's load, again (8 of a vision
    script's 9 s; ``train_here``). With ``ray``, for the tests about Ray itself (several workers or nodes,
    the asynchronous forms, a worker's death), or ``site`` (a folder of extra plugins put first on the
    job's ``PYTHONPATH``), it runs in a fresh process, killed past ``timeout`` seconds (a few times the
    job's measured time), the test failing with the job's name: a hang costs minutes, not the CI's budget.
    So does a job on an engine other than hf: vLLM's and SGLang's keep process-wide state (their engine
    core, the device's context) that one test process should not carry from job to job. In this process a
    hang is caught by pytest-timeout's backstop (pyproject.toml)."""
    if ray or site is not None or _engine(overrides) != "hf":
        return run_rlcore("train", *overrides, *_in_process(ray), site=site, env={"RAY_AUTH_MODE": "disabled"},
                          timeout=timeout)
    return train_here(*overrides)


def _engine(overrides: tuple[str, ...]) -> str:
    """The rollout engine of the job these ``train`` arguments describe (a job file first, if any, then the
    overrides, rlcore's keys or verl's), read from the loaded configuration as ``rlcore train`` reads it;
    "hf" for arguments that do not load: the job then fails in this process, saying why."""
    from rlcore.config.load import load_job

    path, rest = (overrides[0], overrides[1:]) if overrides and "=" not in overrides[0] else (None, overrides)
    try:
        return load_job(path, list(rest), check=False).config.rollout.name
    except Exception:  # noqa: BLE001 - any loading error is the job's to report, in this process
        return "hf"


def train_here(*overrides: str) -> subprocess.CompletedProcess:
    """``rlcore train`` in this process (``rlcore.cli.main``), what it printed captured as a subprocess's
    would be; the environment's ``RLCORE_*`` variables hidden from it, as ``run_rlcore`` hides them."""
    from rlcore import cli

    args = ["train", *overrides, *_in_process(False)]
    hidden = {k: os.environ.pop(k) for k in [k for k in os.environ if k.startswith("RLCORE_")]}
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            status = cli.main(args)
    finally:
        os.environ.update(hidden)
    return subprocess.CompletedProcess(["rlcore", *args], status, out.getvalue(), err.getvalue())


def start_train(*overrides: str, stdout, ray: bool = False, site: Path | None = None) -> subprocess.Popen:
    """``rlcore train`` in the background (in this process unless ``ray``, as ``train``; ``site`` as
    ``train``'s), in its own process group; the caller waits with ``tests.processes.wait_or_fail`` (or
    kills it with ``kill_family``); ``tests.e2e.stalls.background_job`` does both."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCORE_")} | {"RAY_AUTH_MODE": "disabled"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.Popen([sys.executable, "-m", "rlcore", "train", *overrides, *_in_process(ray)], stdout=stdout,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _in_process(ray: bool) -> list[str]:
    """The override that runs the job's one worker in its driver's process, last so that it wins."""
    return [] if ray else ["trainer.ray=false"]


@contextmanager
def two_node_cluster(cpus_per_node: int, nodes: int = 2) -> Iterator[str]:
    """A simulated Ray cluster of two nodes (or ``nodes``) with ``cpus_per_node`` CPUs each, for the job's
    ``trainer.ray_address``; shut down when the block ends."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=cpus_per_node)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()
