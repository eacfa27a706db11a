"""verl's quickstart command lines, with `python3 -m verl.trainer.main_ppo` replaced by `rlcore train`.

Only the model path (a local tiny model), the sizes and the GPU-only settings (vllm, tensor parallel 2,
8 GPUs, wandb) are changed; every other key is verl's own spelling. ``train`` adds rlcore's
``trainer.ray=false`` (the one worker in the job's own process).
"""

from __future__ import annotations

from tests.e2e.conftest import read_metrics, train


def test_verl_ppo_quickstart(tiny_model, gsm8k_parquet, tmp_path):
    run = tmp_path / "ppo"
    result = train(
        f"data.train_files={gsm8k_parquet}/train.parquet",
        f"data.val_files={gsm8k_parquet}/test.parquet",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "data.max_response_length=16",
        "data.filter_overlong_prompts=True",
        f"actor_rollout_ref.model.path={tiny_model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "critic.optim.lr=1e-5",
        f"critic.model.path={tiny_model}",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.logger=console",
        "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=10",
        "trainer.test_freq=10",
        "trainer.total_epochs=1",
        f"trainer.default_local_dir={run}",
        timeout=60,  # about 8 s
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "critic: on" in result.stdout  # verl's default estimator is gae
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # 16 prompts / 4 per step, one epoch
    assert "critic/vf_loss" in metrics[-1] and "val-core/openai/gsm8k/reward/mean@1" in metrics[-1]


def test_verl_grpo_example(tiny_model, gsm8k_parquet, tmp_path):
    run = tmp_path / "grpo"
    result = train(
        "algorithm.adv_estimator=grpo",
        f"data.train_files={gsm8k_parquet}/train.parquet",
        f"data.val_files={gsm8k_parquet}/test.parquet",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "data.max_response_length=16",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        f"actor_rollout_ref.model.path={tiny_model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.logger=['console']",
        "trainer.project_name=verl_grpo_example_gsm8k",
        "trainer.experiment_name=tiny_function_rm",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=20",
        "trainer.test_freq=5",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={run}",
        timeout=60,  # about 8 s
    )
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert "actor/kl_loss" in metrics[1] and "val-core/openai/gsm8k/reward/mean@1" in metrics[0]
