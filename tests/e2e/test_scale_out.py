"""Worker groups over several workers and nodes, and what happens when a worker dies: Ray's part of a
job (``train(..., ray=True)``); the one-worker reference runs in the job's own process."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import psutil
import pytest
import torch

from tests.e2e.conftest import (checkpoint_tensors, job_overrides, model_weights, read_metrics, start_train, train,
                                two_node_cluster)
from tests.processes import kill_family, wait_or_fail

ALTERNATING_REWARD = """
CALLS = {calls!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    # One reward worker scores the rows in order, whatever the number of training workers: 0, 1, 0, 1, ...
    with open(CALLS, "a") as f:
        f.write("x")
    import os
    return float(os.path.getsize(CALLS) % 2)
"""

GATED_REWARD = """
import os, time

CALLS = {calls!r}
INSIDE = {inside!r}
RELEASE = {release!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    with open(CALLS, "a") as f:
        f.write("x")
    if os.path.getsize(CALLS) > {samples_per_step}:
        open(INSIDE, "w").close()  # inside step 2: wait until the test has killed a worker
        while not os.path.exists(RELEASE):
            time.sleep(0.1)
    return 0.0
"""


# each job's deadline, a few times what it took on the idle 2-core CI machine: 2 steps about 8 s in the
# job's own process, 20 to 25 s under Ray
TIMEOUT_S, RAY_TIMEOUT_S = 60, 120


def alternating_job(tiny_model, gsm8k_parquet, tmp_path, name, **extra):
    reward = tmp_path / f"{name}_reward.py"
    reward.write_text(ALTERNATING_REWARD.format(calls=str(tmp_path / f"{name}.calls")))
    settings = {"trainer.total_training_steps": 2, "trainer.val_before_train": False, "trainer.test_freq": -1,
                "trainer.save_freq": -1, "rollout.do_sample": False} | extra
    return job_overrides(tiny_model, gsm8k_parquet, tmp_path / name, **settings) + [
        "algorithm.adv_estimator=grpo", "rollout.n=2", f"reward.custom_reward_function.path={reward}",
        "reward.num_workers=1"]


def test_two_workers_follow_the_one_worker_loss_trajectory(tiny_model, gsm8k_parquet, tmp_path):
    one = train(*alternating_job(tiny_model, gsm8k_parquet, tmp_path, "one"), timeout=TIMEOUT_S)
    assert one.returncode == 0, one.stdout + one.stderr
    two = train(*alternating_job(tiny_model, gsm8k_parquet, tmp_path, "two", **{"trainer.n_gpus_per_node": 2}),
                ray=True, timeout=RAY_TIMEOUT_S)
    assert two.returncode == 0, two.stdout + two.stderr
    assert "workers: 2 hybrid" in two.stdout
    for a, b in zip(read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two"), strict=True):
        assert a["critic/score/mean"] == b["critic/score/mean"] == 0.5
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "response_length/mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-5), key
        assert "timing_s/dispatch" in b


def test_simulated_two_node_cluster_places_a_worker_on_each_node(tiny_model, gsm8k_parquet, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with two_node_cluster(1) as address:
        result = train(*alternating_job(tiny_model, gsm8k_parquet, tmp_path, "nodes", **{
            "trainer.nnodes": 2, "trainer.n_gpus_per_node": 1, "trainer.ray_address": address}), ray=True,
            timeout=RAY_TIMEOUT_S)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "workers: 2 hybrid (actor, rollout) on 2 node(s)" in result.stdout
        assert [m["step"] for m in read_metrics(tmp_path / "nodes")] == [1, 2]


def hybrid_workers(driver: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in driver.children(recursive=True):
        try:
            if "HybridWorker" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def test_a_killed_worker_stops_the_job_with_one_clear_error(tiny_model, gsm8k_parquet, tmp_path):
    inside, release = tmp_path / "inside", tmp_path / "release"
    reward = tmp_path / "gated.py"
    reward.write_text(GATED_REWARD.format(calls=str(tmp_path / "calls"), inside=str(inside),
                                          release=str(release), samples_per_step=8))
    run = tmp_path / "run"
    overrides = job_overrides(tiny_model, gsm8k_parquet, run, **{
        "trainer.total_training_steps": 3, "trainer.val_before_train": False, "trainer.test_freq": -1,
        "trainer.n_gpus_per_node": 2}) + [
        "algorithm.adv_estimator=grpo", "rollout.n=2", f"reward.custom_reward_function.path={reward}",
        "reward.num_workers=1"]
    log_path = tmp_path / "job.log"
    with open(log_path, "w") as log:
        process = start_train(*overrides, stdout=log, ray=True)
        try:
            driver = psutil.Process(process.pid)
            deadline = time.time() + 300
            while not inside.exists():
                assert process.poll() is None, log_path.read_text()
                assert time.time() < deadline, f"step 2 of the job in {run} never started"
                time.sleep(0.2)
            family = [driver, *driver.children(recursive=True)]
            workers = hybrid_workers(driver)
            assert len(workers) == 2, [w.cmdline() for w in family]
            workers[-1].kill()
            killed_at = time.time()
            release.touch()
        except BaseException:
            kill_family(process)
            raise
        wait_or_fail(process, name=f"the job in {run} after one of its workers was killed", timeout=120)
    elapsed = time.time() - killed_at
    output = log_path.read_text()
    assert process.returncode == 2, output
    assert "hybrid worker rank" in output and "died during" in output, output
    assert "Traceback" not in output
    assert elapsed < 120
    _, alive = psutil.wait_procs([p for p in family if p.pid != driver.pid], timeout=60)
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "1"
    # The last checkpoint holds exactly what step 1 left. Every reward was 0, so every GRPO advantage
    # and gradient was 0, and each of the step's 2 AdamW steps (4 prompts, mini-batches of 2) only
    # decayed the weights by (1 - lr * weight_decay) = (1 - 1e-4 * 0.01); AdamW's moments stayed 0.
    assert json.loads((run / "global_step_1" / "trainer_state.json").read_text())["global_step"] == 1
    saved = checkpoint_tensors(run / "global_step_1" / "actor", tmp_path / "scratch" / "step1.pt")
    decay = 1 - 1e-4 * 0.01
    initial = model_weights(tiny_model)
    assert set(initial) <= set(saved["model"])
    for name, weight in initial.items():
        assert torch.equal(saved["model"][name], weight.clone().mul_(decay).mul_(decay)), name
    moments = saved["optimizer"]["state"]
    assert set(moments) == set(initial)  # one entry per parameter (the tied output head is the embedding)
    for name, state in moments.items():
        assert float(state["step"]) == 2 and not state["exp_avg"].any() and not state["exp_avg_sq"].any(), name


def test_a_dead_peer_is_named_as_the_cause_not_the_collective_error_it_caused(monkeypatch):
    """When a worker dies, its peers fail in the collective they shared with it, and that error may
    reach the driver first; the group waits briefly and names the death (the cause)."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    import ray

    from rlcore.workers.group import WorkerError, WorkerGroup

    @ray.remote(num_cpus=0)
    class Rank:
        def fail_after(self, seconds: float):
            time.sleep(seconds)
            raise RuntimeError("Read error [127.0.0.1]:27055: Connection reset by peer")

        def die_after(self, seconds: float):
            time.sleep(seconds)
            os._exit(1)

    temp_dir = tempfile.mkdtemp(prefix="rlcore-ray-")  # short: Ray's socket paths live under it
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=temp_dir, logging_level="ERROR")
    try:
        group = object.__new__(WorkerGroup)
        group.name, group.overhead_s, group.processes_per_bundle = "hybrid", 0.0, 1
        alive, dying = Rank.remote(), Rank.remote()
        refs = [dying.die_after.remote(1.0), alive.fail_after.remote(0.2)]  # rank 1's error comes first
        with pytest.raises(WorkerError, match=r"hybrid worker rank 0 died during actor step 'compute_log_prob'"):
            group._get(refs, "compute_log_prob")
        refs = [Rank.remote().fail_after.remote(0.1), Rank.remote().fail_after.remote(0.1)]
        with pytest.raises(WorkerError, match=r"rank \d failed during .*Connection reset by peer"):
            group._get(refs, "compute_log_prob")  # nobody died: the error itself is the cause
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
