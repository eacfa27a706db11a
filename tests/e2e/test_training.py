"""Full jobs: PPO and GRPO on a tiny model, validation, checkpoints, resume, verl command lines. Each
runs in the job's own process (``trainer.ray = false``) but the one with two workers."""

from __future__ import annotations

import json
import os
import platform
import signal

import psutil
import torch
import pytest

from tests.conftest import run_rlcore
from tests.e2e.conftest import checkpoint_tensors, job_overrides, model_weights, read_metrics, start_train, train
from tests.e2e.stalls import background_job

STEP_METRICS = ("timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor",
                "timing_s/update_weights", "timing_s/step", "critic/score/mean", "critic/rewards/mean",
                "critic/advantages/mean", "critic/returns/mean", "actor/pg_loss", "actor/entropy", "actor/ppo_kl",
                "actor/pg_clipfrac", "actor/grad_norm", "actor/lr", "response_length/mean",
                "response_length/clip_ratio", "prompt_length/mean", "perf/throughput", "perf/total_num_tokens",
                "perf/time_per_step", "training/global_step", "training/epoch")
# each job's deadline, a few times what it took on the idle 2-core CI machine: up to 3 steps 7 to 9 s in
# the job's own process; the two-worker job 17 s under Ray
TIMEOUT_S, RAY_TIMEOUT_S = 60, 120


def loader_state(run_dir, step):
    return json.loads((run_dir / f"global_step_{step}" / "trainer_state.json").read_text())["loader"]


def test_grpo_with_kl_loss_trains_validates_checkpoints_and_resumes(tiny_model, gsm8k_parquet, tmp_path):
    run = tmp_path / "grpo"
    grpo = ["algorithm.adv_estimator=grpo", "rollout.n=2", "actor.use_kl_loss=true"]
    # a CPU has no peak in rlcore's table: 1 TFLOPS, far above what 2 cores reach, gives perf/mfu/*
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run), *grpo, "trainer.peak_tflops_per_device=1.0",
                   timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reference: on, for actor.use_kl_loss" in result.stdout
    assert "critic: off" in result.stdout

    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert "val-core/openai/gsm8k/reward/mean@1" in metrics[0]
    for name in (*STEP_METRICS, "timing_s/ref", "actor/kl_loss", "timing_s/save_checkpoint"):
        assert name in metrics[1], name
    assert "val-core/openai/gsm8k/reward/mean@1" in metrics[2]
    for step in metrics[1:]:
        assert 0 < step["perf/mfu/actor"] < 1 and 0 < step["perf/mfu/actor_infer"] < 1
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert_run_record(run, result.stdout, metrics)

    # Resume: the same job asked for 3 steps continues at step 3 with the next batch of prompts.
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run, **{"trainer.total_training_steps": 3}), *grpo,
                   "trainer.peak_tflops_per_device=1.0", timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "at step 2" in result.stdout
    assert [m["step"] for m in read_metrics(run)] == [0, 1, 2, 3]
    assert ("warning: the resumed run's configuration changed since its last start (run.toml): "
            "trainer.total_training_steps: 2 -> 3") in result.stdout
    assert "run finished: 3/3 steps" in result.stdout

    straight = tmp_path / "straight"
    result = train(*job_overrides(tiny_model, gsm8k_parquet, straight, **{"trainer.total_training_steps": 3}),
                   *grpo, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert loader_state(run, 3) == loader_state(straight, 3)
    assert loader_state(run, 2) != loader_state(run, 3)

    # Resume equivalence: the interrupted-and-resumed job and the uninterrupted one are the same job,
    # on the CPU bit for bit: every metric of every step except wall-clock ones, and every tensor of
    # the step-3 checkpoint (weights and AdamW state).
    resumed, uninterrupted = read_metrics(run), read_metrics(straight)
    assert [m["step"] for m in uninterrupted] == [0, 1, 2, 3]
    for a, b in zip(resumed, uninterrupted, strict=True):
        assert deterministic(a) == deterministic(b), a["step"]
    saved_resumed = checkpoint_tensors(run / "global_step_3" / "actor", tmp_path / "scratch" / "resumed.pt")
    saved_straight = checkpoint_tensors(straight / "global_step_3" / "actor", tmp_path / "scratch" / "straight.pt")
    assert_same_tensors(saved_resumed, saved_straight)

    # The update moved every weight of the actor away from the initial model (the KL loss and the
    # GRPO advantages give every parameter a gradient).
    initial = model_weights(tiny_model)
    trained = saved_resumed["model"]
    assert set(initial) <= set(trained)  # the checkpoint also names the tied output head
    unchanged = [name for name, value in initial.items() if torch.equal(trained[name], value)]
    assert not unchanged, f"not trained: {unchanged}"


def assert_run_record(run, stdout: str, metrics: list[dict]) -> None:
    """The run folder records the job, the overrides and the versions; the console shows one short
    line per step and a summary naming the checkpoint and its export command."""
    from rlcore.config import load_job

    recorded = load_job(run / "run.toml", check=False).config
    assert recorded.trainer.total_training_steps == 2 and recorded.rollout.n == 2 and recorded.actor.use_kl_loss
    overrides = (run / "overrides.txt").read_text().splitlines()
    assert overrides[0] == "# no job file" and "algorithm.adv_estimator=grpo" in overrides
    environment = json.loads((run / "environment.json").read_text())
    assert environment["versions"]["torch"] == torch.__version__ and environment["backend"] == "fsdp"
    machine = environment["machine"]
    # the CPU platform counts the machine as one device, named after its processor
    expected = ("cuda", torch.cuda.device_count()) if torch.cuda.is_available() else ("cpu", 1)
    assert (machine["device_type"], machine["device_count"]) == expected, machine
    assert len(machine["devices"]) == machine["device_count"] and all(machine["devices"]), machine
    assert machine["cpu_count"] == os.cpu_count() and machine["python"] == platform.python_version(), machine
    lines = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in lines] == ["step 0/2", "step 1/2", "step 2/2"]
    assert "s/step | eta " in lines[1] and max(map(len, lines)) < 300
    assert f"| score {metrics[1]['critic/score/mean']:.4g} |" in lines[1]
    # the workers' peak memory (on the CPU, resident memory: more than the model's weights) and verl's timings
    assert metrics[1]["perf/max_memory_allocated_gb"] > 0.01 and metrics[1]["perf/cpu_memory_used_gb"] > 0
    assert metrics[1]["timing_per_token_ms/gen"] > 0 and 0 < metrics[1]["timing_share/gen"] < 1
    reward = metrics[2]["val-core/openai/gsm8k/reward/mean@1"]
    summary = stdout[stdout.index("run finished: 2/2 steps"):].splitlines()
    assert summary[1].startswith("  val-core/openai/gsm8k/acc/mean@1: last ")
    assert summary[2].startswith(f"  val-core/openai/gsm8k/reward/mean@1: last {reward:.4g} (step 2), best ")
    assert summary[-2:] == [f"  checkpoint: {run / 'global_step_2'}",
                            f"  export: rlcore export {run / 'global_step_2'} --to {run / 'global_step_2'}-hf"]


def deterministic(metrics: dict) -> dict:
    """A step's metrics without the wall-clock ones (timings, throughput)."""
    return {k: v for k, v in metrics.items()
            if not k.startswith(("timing_s/", "timing_per_token_ms/", "timing_share/", "perf/"))}


def assert_same_tensors(a, b, path: str = "") -> None:
    """Two nested checkpoint structures hold the same keys and bitwise-equal tensors."""
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys differ: {set(a) ^ set(b)}"
        for key in a:
            assert_same_tensors(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{path} differs: max |a - b| = {(a.double() - b.double()).abs().max().item()}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_ppo_with_critic_and_kl_in_reward(tiny_model, gsm8k_parquet, tmp_path):
    run = tmp_path / "ppo"
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run), "algorithm.adv_estimator=gae",
                   "algorithm.use_kl_in_reward=true", "trainer.val_before_train=false", timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "critic: on" in result.stdout and "reference: on, for algorithm.use_kl_in_reward" in result.stdout
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    for name in (*STEP_METRICS, "timing_s/values", "timing_s/update_critic", "critic/vf_loss",
                 "critic/vf_explained_var", "critic/values/mean", "actor/reward_kl_penalty"):
        assert name in metrics[0], name
    assert (run / "global_step_2" / "critic").is_dir()


STALLING_REWARD = """
import os, time

CALLS = {calls!r}
MARKER = {marker!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    with open(CALLS, "a") as f:
        f.write("x")
    if os.path.getsize(CALLS) > {samples_per_step} and not os.path.exists(MARKER):
        open(MARKER, "w").close()  # now inside step 2, after step 1's checkpoint: wait to be killed
        time.sleep(600)
    return 0.0
"""


def test_run_killed_mid_step_resumes_from_last_complete_checkpoint(tiny_model, gsm8k_parquet, tmp_path):
    run = tmp_path / "killed"
    marker = tmp_path / "inside-step-2"
    reward = tmp_path / "stalling_reward.py"
    reward.write_text(STALLING_REWARD.format(calls=str(tmp_path / "calls"), marker=str(marker),
                                             samples_per_step=8))
    overrides = job_overrides(tiny_model, gsm8k_parquet, run, **{"trainer.total_training_steps": 3,
                                                                  "trainer.test_freq": -1}) + [
        "algorithm.adv_estimator=grpo", "rollout.n=2", "trainer.val_before_train=false",
        f"reward.custom_reward_function.path={reward}"]
    with background_job(lambda stdout: start_train(*overrides, stdout=stdout), tmp_path / "killed.log") as job:
        job.wait_until(marker.exists, f"step 2 of the job in {run}")
        family = job.family()
        job.signal_family(signal.SIGKILL)
        job.process.wait(timeout=30)
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"processes left after the kill: {alive}"
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert [m["step"] for m in read_metrics(run)] == [1]

    result = train(*overrides, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "at step 1" in result.stdout
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3]
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "3"
    # a kill inside a save, and the clean-up of its staging folder: test_checkpoint_kill.py


def test_custom_reward_file_scores_training_and_validation(tiny_model, gsm8k_parquet, tmp_path):
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(
        "def my_reward_fn(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': 0.25, 'pred': solution_str[-3:]}\n")
    run = tmp_path / "custom"
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run, **{"trainer.total_training_steps": 1,
                                                                      "trainer.test_freq": 1,
                                                                      "data.val_batch_size": 3}),
                   "algorithm.adv_estimator=grpo", "rollout.n=2",
                   f"custom_reward_function.path={reward_file}", "custom_reward_function.name=my_reward_fn",
                   "rollout.val.n=2", "rollout.val.do_sample=true", "rollout.val.temperature=1.0", timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    for step in (0, 1):  # the function's "pred" reaches validation: verl's maj@k beside mean@k
        for metric in ("val-core/openai/gsm8k/reward/mean@2", "val-core/openai/gsm8k/reward/maj@2/mean",
                       "val-core/openai/gsm8k/reward/best@2/mean", "val-aux/openai/gsm8k/reward/worst@2/mean"):
            assert metrics[step][metric] == pytest.approx(0.25), (step, metric)
    assert metrics[1]["critic/score/mean"] == pytest.approx(0.25)


def test_remax_baselines_stay_with_their_prompts_when_two_workers_balance_the_batch(tiny_model, gsm8k_parquet,
                                                                                    tmp_path):
    """ReMax's greedy baseline is scored per prompt before trainer.balance_batch reorders the rows
    over the workers; with a reward that depends only on the prompt, every sample scores its
    baseline's score, so every advantage is 0, unless a baseline lands on another prompt's rows."""
    reward = tmp_path / "by_prompt.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(sum(map(ord, ground_truth)) % 5)\n")
    run = tmp_path / "remax"
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run, **{"trainer.total_training_steps": 2,
                                                                      "trainer.val_before_train": False,
                                                                      "trainer.test_freq": -1,
                                                                      "trainer.save_freq": -1,
                                                                      "trainer.n_gpus_per_node": 2}),
                   "algorithm.adv_estimator=remax", "rollout.n=2", f"custom_reward_function.path={reward}", ray=True,
                   timeout=RAY_TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    assert any(m["critic/score/max"] > m["critic/score/min"] for m in metrics)  # prompts score differently
    for m in metrics:
        assert m["critic/advantages/max"] == m["critic/advantages/min"] == 0.0
        assert "timing_s/gen_max" in m and "actor/pg_loss" in m
        assert m["global_seqlen/balanced_max"] <= m["global_seqlen/max"]
        assert m["global_seqlen/balanced_min"] + m["global_seqlen/balanced_max"] == 2 * m["global_seqlen/mean"]


def test_dynamic_sampling_and_overlong_shaping(tiny_model, gsm8k_parquet, tmp_path):
    reward = tmp_path / "parity.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) % 2)\n")
    run, rollouts = tmp_path / "dapo", tmp_path / "rollouts"
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run, **{"trainer.total_training_steps": 1,
                                                                      "trainer.val_before_train": False,
                                                                      "trainer.test_freq": -1}),
                   "algorithm.adv_estimator=grpo", "rollout.n=2", f"custom_reward_function.path={reward}",
                   "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=score",
                   "algorithm.filter_groups.max_num_gen_batches=30",
                   # a buffer of 15 of data.max_response_length's 16 tokens: every response, whatever
                   # its length L >= 1, is shaped by -(L - 1) / 15 * 0.5
                   "reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=15",
                   "reward.overlong_buffer.penalty_factor=0.5", f"trainer.rollout_data_dir={json.dumps(str(rollouts))}",
                   # verl's DAPO recipe with rollout importance sampling: mask mode and a veto
                   "algorithm.rollout_is_threshold=2.0", "algorithm.rollout_is=true",
                   "algorithm.rollout_is_mode=mask", "algorithm.rollout_is_veto_threshold=1e-4", timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    (metrics,) = read_metrics(run)
    assert metrics["train/num_gen_batches"] >= 1
    # the hf engine samples with the actor's own weights in fp32: its log-probs are the actor's
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-4)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    # every kept group has one odd-length and one even-length response: scores 0 and 1 before shaping
    records = [json.loads(line) for line in (rollouts / "1.jsonl").read_text().splitlines()]
    assert len(records) == 8 and sorted(r["score"] for r in records) == [0.0] * 4 + [1.0] * 4
    # after shaping (the reward, no KL in it): each sample lost (L - 1) / 30, on average (mean(L) - 1) / 30
    penalties = [r["reward"] - r["score"] for r in records]
    assert all(-0.5 <= p <= 0.0 for p in penalties), penalties
    assert metrics["response_length/mean"] > 1.0  # so the shaping is not 0
    expected = -(metrics["response_length/mean"] - 1.0) / 30
    assert sum(penalties) / 8 == pytest.approx(expected, abs=1e-6)
    assert metrics["critic/score/mean"] == pytest.approx(0.5 + expected, abs=1e-6)


def test_a_reward_model_scores_training_and_validation(tiny_model, gsm8k_parquet, tmp_path):
    """verl's reward-model keys: a sequence-classification model replaces the reward functions."""
    from rlcore.testing import build_tiny_reward_model

    reward_model = build_tiny_reward_model(tmp_path / "tiny-rm")
    run = tmp_path / "rm"
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run, **{"trainer.total_training_steps": 1,
                                                                      "trainer.save_freq": -1}),
                   "algorithm.adv_estimator=grpo", "rollout.n=2", "reward_model.enable=true",
                   f"reward_model.model.path={reward_model}", "reward_model.micro_batch_size_per_gpu=3",
                   timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"reward model: on, {reward_model} scores the responses" in result.stdout
    validation, step = read_metrics(run)
    assert "val-core/openai/gsm8k/reward/mean@1" in validation
    # a random reward model's outputs: real numbers, different for every response, not a rule's 0 or 1
    assert step["critic/score/max"] > step["critic/score/min"]
    assert step["critic/score/mean"] not in (0.0, 1.0)


def test_generations_are_written_and_shown_and_val_only_validates_a_checkpoint(tiny_model, gsm8k_parquet,
                                                                               tmp_path):
    """verl's trainer.rollout_data_dir, validation_data_dir, log_val_generations and val_only."""
    run, rollouts, validations = tmp_path / "run", tmp_path / "rollouts", tmp_path / "validations"
    dumps = [f"trainer.rollout_data_dir={json.dumps(str(rollouts))}",
             f"trainer.validation_data_dir={json.dumps(str(validations))}", "trainer.log_val_generations=2"]
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run, **{"trainer.save_freq": 2}),
                   "algorithm.adv_estimator=grpo", "rollout.n=2", *dumps, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    for step in (1, 2):  # 4 prompts x 2 samples per step
        records = [json.loads(line) for line in (rollouts / f"{step}.jsonl").read_text().splitlines()]
        assert len(records) == 8 and {r["step"] for r in records} == {step}
        assert {"input", "output", "gts", "score", "reward", "data_source"} <= set(records[0])
        assert sum(r["score"] for r in records) / 8 == pytest.approx(metrics[step]["critic/score/mean"], abs=1e-6)
        assert all(r["input"].strip() and r["gts"] for r in records)
        assert "timing_s/dump_rollout_generations" in metrics[step]
    assert sorted(p.name for p in validations.iterdir()) == ["0.jsonl", "2.jsonl"]
    before = [json.loads(line) for line in (validations / "0.jsonl").read_text().splitlines()]
    assert len(before) == 4
    assert sum(r["score"] for r in before) / 4 == pytest.approx(
        metrics[0]["val-core/openai/gsm8k/reward/mean@1"], abs=1e-6)
    shown = [line for line in result.stdout.splitlines() if line.startswith("validation generations at step")]
    assert shown == ["validation generations at step 0 (2 shown):", "validation generations at step 2 (2 shown):"]

    # val_only: resume the step-2 checkpoint, validate it, train nothing, save nothing.
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run, **{"trainer.total_training_steps": 4}),
                   "algorithm.adv_estimator=grpo", "rollout.n=2", "trainer.val_only=true", *dumps, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "at step 2" in result.stdout
    after = read_metrics(run)
    assert [m["step"] for m in after] == [0, 1, 2, 2] and "val-core/openai/gsm8k/reward/mean@1" in after[-1]
    assert not any(k.startswith(("actor/", "timing_s/gen")) for k in after[-1])
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("global_step")) == ["global_step_2"]
    assert sorted(p.name for p in rollouts.iterdir()) == ["1.jsonl", "2.jsonl"]


def test_a_lora_job_trains_the_adapters_and_exports_the_merged_model(tiny_model, gsm8k_parquet, tmp_path):
    """verl's actor_rollout_ref.model.lora_rank / lora_alpha / target_modules on the fsdp backend, and
    critic.model.lora_rank on a PPO critic."""
    from transformers import AutoModelForCausalLM

    reward = tmp_path / "parity.py"  # the samples of a prompt score differently: advantages are not 0
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) % 2)\n")
    run = tmp_path / "lora"
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run, **{"trainer.total_training_steps": 2,
                                                                      "trainer.val_before_train": False,
                                                                      "actor.optim.lr": 1e-2}),
                   "algorithm.adv_estimator=gae", "rollout.n=4", "actor.use_kl_loss=true",
                   f"custom_reward_function.path={reward}", "critic.model.lora_rank=4",
                   "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
                   "actor_rollout_ref.model.target_modules=[q_proj,v_proj]", timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "LoRA rank 4 (alpha 8) on q_proj, v_proj" in result.stdout
    assert "reference: on, for actor.use_kl_loss (the actor's base model: its LoRA adapters off)" in result.stdout
    metrics = read_metrics(run)
    assert metrics[0]["actor/grad_norm"] > 0 and metrics[1]["actor/kl_loss"] != 0  # it moved off the reference
    state = json.loads((run / "global_step_2" / "actor" / "state.json").read_text())
    assert state["lora"] == {"rank": 4, "alpha": 8.0}
    assert json.loads((run / "global_step_2" / "critic" / "state.json").read_text())["lora"] == {
        "rank": 4, "alpha": 16.0}
    assert all("critic/vf_loss" in m for m in metrics)
    exported = run_rlcore("export", str(run), "--to", str(tmp_path / "hf"))
    assert exported.returncode == 0, exported.stderr
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, dict(base.named_parameters())[n])}
    assert changed and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in changed)
    # the checkpoint's PEFT adapter (lora_adapter/) on the base model computes as the merged export
    peft = pytest.importorskip("peft", reason="peft is part of the test extra")
    adapted = peft.PeftModel.from_pretrained(base, str(run / "global_step_2" / "actor" / "lora_adapter")).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = (torch.log_softmax(m(input_ids=ids).logits.float(), -1) for m in (model.eval(), adapted))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
