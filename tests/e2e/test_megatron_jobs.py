"""GRPO jobs on the megatron backend (GPUs only): tensor parallel 2 over two GPUs follows the one-GPU
job step for step.

The model has Qwen2.5-0.5B's layer shape (14 query and 2 key/value heads: SmolLM2's 9 heads do not
split over 2 ranks) with random weights and the tiny tokenizer, so the reward pays what a random model
can learn: the share of digits in its answer. The jobs run in fp32, seeded: step 1's samples are the
same on both layouts (the two ranks of the tensor-parallel group generate their pooled prompts
together); later steps start from weights that differ by reduction order only.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.e2e.conftest import job_overrides, read_metrics, train

DIGIT_SHARE_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
"""
STEPS = 3
COMPARED = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy",
            "actor/grad_norm")


def needs_two_gpus_and_megatron():
    for module, why in (("megatron.core", "megatron-core is not installed (Python >= 3.12)"),
                        ("ray", "ray is not installed")):
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            pytest.skip(why)
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: the megatron backend runs on GPUs only")


@pytest.fixture(scope="module")
def qwen_shaped(tmp_path_factory):
    needs_two_gpus_and_megatron()
    from rlcore.testing import QWEN2_5_0_5B_SHAPE, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "qwen2.5-0.5b-shaped", **QWEN2_5_0_5B_SHAPE)


def grpo_job(model, data, run_dir, reward, *extra: str) -> list[dict]:
    overrides = job_overrides(
        model, data, run_dir, **{
            "model.dtype": "float32", "data.train_batch_size": 16, "data.max_response_length": 48,
            "actor.ppo_mini_batch_size": 16, "actor.ppo_micro_batch_size_per_gpu": 8, "actor.optim.lr": 2e-5,
            "actor.use_kl_loss": True, "actor.kl_loss_coef": 0.01, "rollout.n": 4,
            "rollout.log_prob_micro_batch_size_per_gpu": 16, "ref.log_prob_micro_batch_size_per_gpu": 16,
            "trainer.total_training_steps": STEPS, "trainer.save_freq": -1, "trainer.test_freq": -1,
            "trainer.val_before_train": False})
    result = train(*overrides, "algorithm.adv_estimator=grpo", "model_engine=megatron", "async_training.mode=off",
                   f"reward.custom_reward_function.path={reward}", *extra, ray=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    layout = "tensor parallel 2 x pipeline parallel 1 x data parallel 1" if "trainer.n_gpus_per_node=2" in extra \
        else "tensor parallel 1 x pipeline parallel 1 x data parallel 1"
    assert layout in result.stdout + result.stderr
    return read_metrics(run_dir)


def test_tensor_parallel_2_follows_the_one_gpu_grpo_job(qwen_shaped, gsm8k_parquet, tmp_path):
    reward = tmp_path / "digit_share.py"
    reward.write_text(DIGIT_SHARE_REWARD)
    one = grpo_job(qwen_shaped, gsm8k_parquet, tmp_path / "tp1", reward, "trainer.n_gpus_per_node=1")
    two = grpo_job(qwen_shaped, gsm8k_parquet, tmp_path / "tp2", reward, "trainer.n_gpus_per_node=2",
                   "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2")
    assert len(one) == len(two) == STEPS
    for key in COMPARED:
        print(f"{key:24s} 1 GPU {[m[key] for m in one]}\n{'':24s} TP 2  {[m[key] for m in two]}")
    print("timing_s/step           1 GPU", [round(m["timing_s/step"], 1) for m in one],
          " TP 2", [round(m["timing_s/step"], 1) for m in two])
    # step 1: the same samples, so the same scores and lengths; losses up to reduction order. Two
    # workers balance the batch (trainer.balance_batch), so means are summed in another order.
    assert two[0]["critic/score/mean"] == pytest.approx(one[0]["critic/score/mean"], rel=1e-6)
    assert one[0]["response_length/mean"] == two[0]["response_length/mean"]
    for first, second in zip(one, two):
        assert second["actor/pg_loss"] == pytest.approx(first["actor/pg_loss"], abs=2e-3)
        assert second["actor/kl_loss"] == pytest.approx(first["actor/kl_loss"], abs=1e-3)
        assert second["actor/entropy"] == pytest.approx(first["actor/entropy"], rel=1e-2)
        assert second["actor/grad_norm"] == pytest.approx(first["actor/grad_norm"], rel=5e-2)
        assert second["critic/score/mean"] == pytest.approx(first["critic/score/mean"], abs=0.02)
    assert one[0]["actor/grad_norm"] > 0 and one[-1]["actor/kl_loss"] > 0  # it trained
