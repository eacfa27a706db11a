"""The asynchronous mode (docs/async.md): whole jobs on the tiny model, split and colocated. Its rollout
workers are Ray actors: these jobs run under Ray (``train(..., ray=True)``); their lockstep reference
runs in the job's own process."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import job_overrides, parity_reward, read_metrics, start_train, train, two_node_cluster
from tests.processes import kill_family, wait_or_fail

GRPO = ["algorithm.adv_estimator=grpo", "rollout.n=2"]
QUIET = {"trainer.val_before_train": False, "trainer.test_freq": -1, "trainer.save_freq": -1}
LOSSES = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean", "response_length/mean")


def async_job(tiny_model, gsm8k_parquet, run, mode: str, staleness: int, **extra) -> list[str]:
    return job_overrides(tiny_model, gsm8k_parquet, run, **(QUIET | extra)) + GRPO + parity_reward(run.parent) + [
        f'async_training.mode="{mode}"', f"async_training.max_staleness={staleness}"]


ENGINES_LINE = {"split": "workers: 1 rollout (hf engine, devices of their own)",
                "colocated": "workers: 1 rollout (hf engine, each a process on its trainer worker's device)"}


def test_both_forms_at_staleness_zero_give_the_losses_of_lockstep(tiny_model, gsm8k_parquet, tmp_path):
    steps = {"trainer.total_training_steps": 3}
    lockstep = train(*job_overrides(tiny_model, gsm8k_parquet, tmp_path / "sync", **(QUIET | steps)), *GRPO,
                     *parity_reward(tmp_path), "async_training.mode=off", timeout=TIMEOUT_S)
    assert lockstep.returncode == 0, lockstep.stdout + lockstep.stderr
    sync_metrics = read_metrics(tmp_path / "sync")
    for mode in ("split", "colocated"):
        result = train(*async_job(tiny_model, gsm8k_parquet, tmp_path / mode, mode, 0, **steps), ray=True,
                       timeout=RAY_TIMEOUT_S)
        assert result.returncode == 0, result.stdout + result.stderr
        assert ENGINES_LINE[mode] in result.stdout and "workers: 1 trainer (actor)" in result.stdout
        if mode == "colocated":  # what shares the device, left unset: chosen at start, said and recorded
            assert ("colocated arrangement: async_training.engines_per_device = 1, trainer_compute_share = 0.5, "
                    "engine_compute_share = 1, kernel_priority = 'equal': one engine: the arrangements by model "
                    "size were measured with concurrent sharing on NVIDIA GPUs") in result.stdout
            recorded = next((tmp_path / mode).rglob("run.toml")).read_text()
            assert "engines_per_device = 1" in recorded and "engine_compute_share = 1.0" in recorded
            assert 'kernel_priority = "equal"' in recorded
        async_metrics = read_metrics(tmp_path / mode)
        assert [m["step"] for m in async_metrics] == [1, 2, 3]
        for a, b in zip(sync_metrics, async_metrics, strict=True):
            assert b["async/staleness_max"] == 0 and b["async/policy_version"] == a["step"] - 1
            for key in LOSSES:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (mode, a["step"], key)
            assert b["async/weight_sync_s"] > 0 and b["async/weight_sync_gb"] > 0
            assert a["actor/grad_norm"] > 0  # the policy moves: version k differs from version k - 1


CORRECTION = ["algorithm.rollout_is_threshold=2.0", "algorithm.rollout_is=true"]
# each job's deadline, a few times what it took on the idle 2-core CI machine: up to 4 steps about 8 s
# in the job's own process, 15 to 25 s under Ray
TIMEOUT_S, RAY_TIMEOUT_S = 60, 120


GATED_PARITY_REWARD = """
import os, time

CALLS, INSIDE, RELEASE = {calls!r}, {inside!r}, {release!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    with open(CALLS, "a") as f:
        f.write("x")
    if os.path.getsize(CALLS) > {samples_before_gate} and not os.path.exists(RELEASE):
        open(INSIDE, "w").close()  # scoring step 3, step 4's batch generating: wait to be killed
        while not os.path.exists(RELEASE):
            time.sleep(0.1)
    return float(len(solution_str) % 2)
"""


def trained_prompts(run) -> dict[int, list[str]]:
    """Each step's prompts (one per sample) as the job wrote its generations."""
    return {int(path.stem): sorted(json.loads(line)["input"] for line in path.read_text().splitlines())
            for path in sorted((run / "generations").glob("*.jsonl"))}


@pytest.mark.parametrize("mode", ["split", "colocated"])
def test_a_killed_async_run_resumes_without_losing_or_repeating_a_sample(tiny_model, gsm8k_parquet, tmp_path, mode):
    """A run killed in step 3 resumes from step 2's checkpoint and trains what the uninterrupted run
    trains; the uninterrupted run is also each form's staleness-1 job (``assert_one_batch_ahead``)."""
    # 16 prompts, 4 a step: 4 steps are one epoch, every prompt trained once; validation after step 3
    settings = {"trainer.total_training_steps": 4, "trainer.save_freq": 1, "trainer.test_freq": 3}
    gate = {name: str(tmp_path / name) for name in ("calls", "inside", "release")}
    reward = tmp_path / "gated_reward.py"
    reward.write_text(GATED_PARITY_REWARD.format(**gate, samples_before_gate=2 * 8))

    def job(name):
        run = tmp_path / name
        return job_overrides(tiny_model, gsm8k_parquet, run, **(QUIET | settings | {
            "trainer.rollout_data_dir": str(run / "generations")})) + GRPO + [
            f"reward.custom_reward_function.path={reward}", "reward.num_workers=1", f'async_training.mode="{mode}"',
            "async_training.max_staleness=1", *CORRECTION]

    run = tmp_path / "killed"
    with open(tmp_path / "killed.log", "w") as log:
        process = start_train(*job("killed"), stdout=log, ray=True)
        try:
            deadline = time.time() + 300
            while not (tmp_path / "inside").exists():
                assert process.poll() is None, (tmp_path / "killed.log").read_text()
                assert time.time() < deadline, "the job never reached step 3"
                time.sleep(0.2)
        finally:
            kill_family(process)
        wait_or_fail(process, name=f"the killed job in {run}", timeout=60)
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "2"
    state = json.loads((run / "global_step_2" / "trainer_state.json").read_text())
    assert state["loader"]["position"] == 2 and state["policy_version"] == 2  # batch 3 was drawn, not trained
    assert sorted(trained_prompts(run)) == [1, 2]

    (tmp_path / "release").touch()
    resumed = train(*job("killed"), ray=True, timeout=RAY_TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "at step 2" in resumed.stdout
    straight = train(*job("straight"), ray=True, timeout=RAY_TIMEOUT_S)
    assert_one_batch_ahead(straight, tmp_path / "straight", mode)

    killed, uninterrupted = trained_prompts(run), trained_prompts(tmp_path / "straight")
    assert sorted(killed) == sorted(uninterrupted) == [1, 2, 3, 4]
    assert killed == uninterrupted  # the same prompts at the same steps
    every = [prompt for step in killed.values() for prompt in step]
    assert len(set(every)) == 16 and len(every) == 16 * 2  # each of the 16 prompts once, its 2 samples
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3, 4]
    assert [m["async/staleness_max"] for m in read_metrics(run)] == [0, 1, 0, 1]  # the resume restarts the pipeline
    # every sample's version is in its record: step 3 regenerated from the checkpoint's weights (version 2)
    versions = {int(path.stem): {json.loads(line)["policy_version"] for line in path.read_text().splitlines()}
                for path in (run / "generations").glob("*.jsonl")}
    assert versions == {1: {0}, 2: {0}, 3: {2}, 4: {2}}


def assert_one_batch_ahead(result, run, mode: str) -> None:
    """An uninterrupted 4-step job at staleness 1 with the rollout correction on: each batch but the
    first was generated one version behind the policy that trains it, and the correction sees it."""
    assert result.returncode == 0, result.stdout + result.stderr
    assert ENGINES_LINE[mode] in result.stdout and "workers: 1 trainer (actor)" in result.stdout
    if mode == "colocated":
        assert "async: colocated form" in result.stdout
        assert ("workers: 1 rollout (hf engine, each a process on its trainer worker's device) on 1 node(s); weights "
                "from each trainer worker to its own in device memory it lends (no copy through the host)"
                ) in result.stdout
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    # step 1's batch comes from the initial weights (version 0, the policy that trains it); each later
    # batch was generated while the step before it trained: one version behind
    assert [(m["async/staleness_min"], m["async/staleness_max"]) for m in metrics] == [(0, 0), (1, 1), (1, 1), (1, 1)]
    assert [m["async/policy_version"] for m in metrics] == [0, 1, 2, 3]
    assert all(m["async/weight_sync_s"] > 0 and m["async/weight_sync_gb"] > 0 for m in metrics)
    # the correction compares the engine's log-probs with the trained policy's: equal on-policy (fp32
    # on the CPU, the same weights), apart once the samples are stale
    assert metrics[0]["rollout_corr/k3_kl"] < 1e-8 and metrics[0]["rollout_corr/rollout_is_std"] < 1e-5
    assert metrics[0]["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-5)
    for stale in metrics[1:]:  # weights spread around 1 (measured: std ~0.01, k3 KL ~3e-5 to 6e-5)
        assert stale["rollout_corr/k3_kl"] > 1e-6 and stale["rollout_corr/rollout_is_std"] > 1e-3
    assert "val-core/openai/gsm8k/reward/mean@1" in metrics[2]  # validation through the rollout workers


def test_split_form_on_a_simulated_two_node_cluster(tiny_model, gsm8k_parquet, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with two_node_cluster(1) as address:
        run = tmp_path / "nodes"
        result = train(*async_job(tiny_model, gsm8k_parquet, run, "split", 1, **{
            "trainer.total_training_steps": 2, "trainer.ray_address": address}), *CORRECTION, ray=True,
                       timeout=RAY_TIMEOUT_S)
        assert result.returncode == 0, result.stdout + result.stderr
        # one CPU a node: the trainer's worker takes one node, the rollout pool's the other, and the
        # weights cross between them over the bridge
        assert "workers: 1 trainer (actor) on 1 node(s)" in result.stdout
        assert ("workers: 1 rollout (hf engine, devices of their own) on 1 node(s); weights from trainer rank 0 "
                "over a gloo group spanning 2 node(s)") in result.stdout
        metrics = read_metrics(run)
        assert [m["async/staleness_max"] for m in metrics] == [0, 1]
        assert all(m["async/weight_sync_gb"] > 0 for m in metrics)


def test_colocated_form_on_a_simulated_two_node_cluster(tiny_model, gsm8k_parquet, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    from safetensors import safe_open

    # two CPUs a node: a trainer worker and the rollout worker beside it, in one bundle of each node
    with two_node_cluster(2) as address:
        run = tmp_path / "nodes"
        result = train(*async_job(tiny_model, gsm8k_parquet, run, "colocated", 1, **{
            "trainer.total_training_steps": 2, "trainer.nnodes": 2, "trainer.ray_address": address}),
                       *CORRECTION, ray=True, timeout=RAY_TIMEOUT_S)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "workers: 2 trainer (actor) on 2 node(s)" in result.stdout
        # the job checks that each rollout worker reports the node (and devices) of its trainer worker
        assert ("workers: 2 rollout (hf engine, each a process on its trainer worker's device) on 2 node(s)"
                in result.stdout)
        metrics = read_metrics(run)
        assert [m["async/staleness_max"] for m in metrics] == [0, 1]
        # each trainer worker sends the whole model (fp32 on the CPU, the tied head once) to its own engine
        with safe_open(tiny_model / "model.safetensors", "pt") as f:
            model_bytes = sum(f.get_tensor(name).nbytes for name in f.keys())
        assert all(m["async/weight_sync_gb"] == pytest.approx(2 * model_bytes / 1e9, rel=1e-6) for m in metrics)


def test_two_engines_beside_the_trainer_generate_half_the_batch_each_under_the_synced_weights(
        tiny_model, gsm8k_parquet, tmp_path, monkeypatch):
    """``async_training.engines_per_device = 2``: the batch splits over two engine processes beside the one
    trainer worker; each step trains the prompts lockstep trains, and both engines take every sync (their
    log-probs match the policy that generated with them)."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    settings = {"trainer.total_training_steps": 3}

    def generations(name):
        return {"trainer.rollout_data_dir": str(tmp_path / name / "generations")}

    lockstep = train(*job_overrides(tiny_model, gsm8k_parquet, tmp_path / "sync", **(
        QUIET | settings | generations("sync"))), *GRPO, *parity_reward(tmp_path), "async_training.mode=off",
                     timeout=TIMEOUT_S)
    assert lockstep.returncode == 0, lockstep.stdout + lockstep.stderr
    # three CPUs on the node: a trainer worker and two rollout workers in its bundle
    with two_node_cluster(3, nodes=1) as address:
        run = tmp_path / "two"
        result = train(*async_job(tiny_model, gsm8k_parquet, run, "colocated", 1, **(settings | generations("two") | {
            "trainer.ray_address": address, "async_training.engines_per_device": 2})), *CORRECTION, ray=True,
                       timeout=RAY_TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("workers: 2 rollout (hf engine, 2 processes on each trainer worker's device, each generating 1/2 of its "
            "batch (async_training.engines_per_device)) on 1 node(s)") in result.stdout
    assert trained_prompts(run) == trained_prompts(tmp_path / "sync")  # every prompt once, its 2 samples
    metrics = read_metrics(run)
    assert [(m["async/staleness_min"], m["async/staleness_max"]) for m in metrics] == [(0, 0), (1, 1), (1, 1)]
    versions = {int(path.stem): {json.loads(line)["policy_version"] for line in path.read_text().splitlines()}
                for path in (run / "generations").glob("*.jsonl")}
    assert versions == {1: {0}, 2: {0}, 3: {1}}
    # both engines hold the weights they say: on-policy at step 1, one version behind after (an engine
    # without the synced weights would be two versions behind, or far off); a step whose groups all scored
    # alike does not move the policy (k3 0 at the next)
    kl = [m["rollout_corr/k3_kl"] for m in metrics]
    assert kl[0] < 1e-8 and max(kl) < 1e-3 and max(kl[1:]) > 1e-7, kl
    assert all(m["async/weight_sync_gb"] > 0 for m in metrics)


@pytest.mark.parametrize("mode", ["split", "colocated"])
def test_a_dead_rollout_worker_stops_the_job_with_one_clear_error(tiny_model, gsm8k_parquet, tmp_path, mode):
    import psutil

    gate = {name: str(tmp_path / name) for name in ("calls", "inside", "release")}
    reward = tmp_path / "gated_reward.py"
    reward.write_text(GATED_PARITY_REWARD.format(**gate, samples_before_gate=2 * 8))
    run = tmp_path / "run"
    overrides = job_overrides(tiny_model, gsm8k_parquet, run, **(QUIET | {
        "trainer.total_training_steps": 4, "trainer.save_freq": 1})) + GRPO + [
        f"reward.custom_reward_function.path={reward}", "reward.num_workers=1", f'async_training.mode="{mode}"',
        "async_training.max_staleness=1"]
    with open(tmp_path / "job.log", "w") as log:
        process = start_train(*overrides, stdout=log, ray=True)
        try:
            driver = psutil.Process(process.pid)
            deadline = time.time() + 300
            while not (tmp_path / "inside").exists():  # step 3 scores while step 4's batch generates
                assert process.poll() is None, (tmp_path / "job.log").read_text()
                assert time.time() < deadline, "the job never reached step 3"
                time.sleep(0.2)
            family = [driver, *driver.children(recursive=True)]
            rollout = [p for p in family if "RolloutWorker" in " ".join(p.cmdline())]
            assert len(rollout) == 1, [p.cmdline() for p in family]
            rollout[0].kill()
            killed_at = time.time()
            (tmp_path / "release").touch()
        except BaseException:
            kill_family(process)
            raise
        wait_or_fail(process, name=f"the job in {run} after its rollout worker was killed", timeout=120)
    output = (tmp_path / "job.log").read_text()
    assert process.returncode == 2, output
    assert "rollout worker rank 0 died during" in output and "Traceback" not in output, output
    assert time.time() - killed_at < 120
    _, alive = psutil.wait_procs([p for p in family if p.pid != driver.pid], timeout=60)
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "2"
