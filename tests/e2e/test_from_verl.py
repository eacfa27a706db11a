"""``rlcore config from-verl``: a verl-style GSM8K GRPO launch script (our own text, in the shape of
verl's examples: variables with defaults, an array of overrides, line continuations) -> a job that
validates and trains a step on the CPU."""

from __future__ import annotations

from tests.conftest import run_rlcore
from tests.e2e.conftest import read_metrics, train

SCRIPT = r"""#!/usr/bin/env bash
set -xeuo pipefail
MODEL_PATH=${MODEL_PATH:-__MODEL__}
DATA_DIR=__DATA__
max_prompt_length=${MAX_PROMPT_LENGTH:-500}
max_response_length=12

ROLLOUT=(
    actor_rollout_ref.rollout.name=hf
    actor_rollout_ref.rollout.n=2
    actor_rollout_ref.rollout.enable_chunked_prefill=True
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
)

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=4 \
    data.max_prompt_length=$((max_prompt_length + 12)) \
    data.max_response_length=${max_response_length} \
    data.filter_overlong_prompts=True \
    data.dataloader_num_workers=4 \
    actor_rollout_ref.model.path=$MODEL_PATH \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.use_torch_compile=False \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.checkpoint.save_contents='["model","optimizer","extra"]' \
    "${ROLLOUT[@]}" \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    algorithm.rollout_correction.rollout_is_threshold=2.0 \
    reward.reward_manager.name=naive \
    trainer.logger='["console"]' \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.val_before_train=False \
    trainer.total_training_steps=1 \
    trainer.total_epochs=1 $@ 2>&1 | tee grpo.log
"""


def test_a_verl_grpo_script_becomes_a_job_that_validates_and_trains_a_step(tiny_model, gsm8k_parquet, tmp_path):
    script = tmp_path / "run_gsm8k_grpo.sh"
    script.write_text(SCRIPT.replace("__MODEL__", str(tiny_model)).replace("__DATA__", str(gsm8k_parquet)))
    job = tmp_path / "job.toml"
    result = run_rlcore("config", "from-verl", str(script), "-o", str(job))
    assert result.returncode == 0, result.stderr
    assert "mapped: actor_rollout_ref.rollout.enable_chunked_prefill -> rollout.vllm.enable_chunked_prefill" \
        in result.stderr
    assert "ignored: verl key data.dataloader_num_workers is ignored (machinery" in result.stderr
    assert "mapped: actor_rollout_ref.actor.use_torch_compile -> actor.use_torch_compile = False" in result.stderr
    assert "refused:" not in result.stderr
    text = job.read_text()
    assert "max_prompt_length = 512" in text and "max_response_length = 12" in text and "n = 2" in text
    assert run_rlcore("config", "validate", str(job)).returncode == 0
    run = tmp_path / "run"
    trained = train(str(job), f"trainer.default_local_dir={run}", timeout=60)  # about 12 s
    assert trained.returncode == 0, trained.stdout + trained.stderr
    (step,) = read_metrics(run)
    assert step["step"] == 1 and "actor/pg_loss" in step


def test_a_refused_key_is_reported_and_the_job_written_without_it(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo "
                      "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2 "
                      "data.train_batch_size=8\n")
    job = tmp_path / "job.toml"
    result = run_rlcore("config", "from-verl", str(script), "-o", str(job))
    assert result.returncode == 2
    refused = "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2"
    assert f"refused: {refused} is refused" in result.stderr
    assert "train_batch_size = 8" in job.read_text() and "virtual_pipeline" not in job.read_text()
