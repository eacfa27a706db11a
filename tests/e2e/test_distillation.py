"""On-policy distillation as a whole job: a tiny student samples, a tiny teacher scores the samples in
the reference's place, and the student's KL to the teacher falls."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import job_overrides, read_metrics, train


@pytest.fixture(scope="module")
def overconfident_student(tiny_model, tmp_path_factory) -> Path:
    """The tiny model with its final norm scaled by 8: its logits are the plain model's times 8, the same
    preferences made sharp. Distilled from the plain model, it must flatten them back; a consistent
    direction that a few steps reach (a sharper teacher's few preferred tokens would seldom be sampled
    by a near-uniform student, whose reverse KL then barely moves)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    out = tmp_path_factory.mktemp("student") / "overconfident"
    shutil.copytree(tiny_model, out)  # the tokenizer and its chat template; the weights are replaced below
    model.save_pretrained(out)
    return out


@pytest.mark.parametrize("loss, policy_gradient", [("k3", False), ("k1", True)], ids=["k3-loss", "k1-policy-gradient"])
def test_distillation_alone_lowers_the_students_kl_to_the_teacher(overconfident_student, tiny_model, gsm8k_parquet,
                                                                  tmp_path, loss, policy_gradient):
    """The k3 estimate backpropagated as a loss (verl's default loss_mode), and verl's examples' form:
    -k1 per token as the advantage of a policy-gradient loss."""
    run = tmp_path / "distill"
    overrides = job_overrides(overconfident_student, gsm8k_parquet, run, **{
        "trainer.total_training_steps": 8, "trainer.save_freq": -1, "trainer.test_freq": -1,
        "trainer.val_before_train": False, "actor.optim.lr": 3e-3, "data.train_batch_size": 8,
        "actor.ppo_mini_batch_size": 8, "actor.ppo_micro_batch_size_per_gpu": 8})
    # verl's spelling, as its on-policy distillation example writes it (rollout.n = 1, GRPO unused)
    result = train(*overrides, "algorithm.adv_estimator=grpo", "rollout.n=2",
                   "distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={tiny_model}",
                   f"distillation.distillation_loss.loss_mode={loss}",
                   f"distillation.distillation_loss.use_policy_gradient={policy_gradient}",
                   "distillation.distillation_loss.use_task_rewards=False")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"reference: the distillation teacher {tiny_model}" in result.stdout
    metrics = [m for m in read_metrics(run) if "actor/distillation_kl" in m]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6, 7, 8]
    kl = [m["actor/distillation_kl"] for m in metrics]
    assert kl[0] > 1.0, kl  # the overconfident student starts far from its teacher
    assert sum(kl[-2:]) / 2 < 0.5 * sum(kl[:2]) / 2, kl
    assert all(m["timing_s/ref"] > 0 for m in metrics)  # the teacher scored every step


def test_several_teachers_each_score_their_data_sources_samples(overconfident_student, tiny_model, gsm8k_parquet,
                                                                tmp_path):
    """verl's multi-teacher form (run_qwen3_8b_mopd_fsdp.sh): a teacher per data source. The GSM8K rows'
    teacher is the plain model; the other data source's teacher is the student itself, so a job that
    scored GSM8K rows with it would start at KL 0 and learn nothing."""
    run = tmp_path / "mopd"
    overrides = job_overrides(overconfident_student, gsm8k_parquet, run, **{
        "trainer.total_training_steps": 6, "trainer.save_freq": -1, "trainer.test_freq": -1,
        "trainer.val_before_train": False, "actor.optim.lr": 3e-3, "data.train_batch_size": 8,
        "actor.ppo_mini_batch_size": 8, "actor.ppo_micro_batch_size_per_gpu": 8})
    teachers = (("gsm8k", "openai/gsm8k", tiny_model), ("geo3k", "hiyouga/geometry3k", overconfident_student))
    result = train(*overrides, "algorithm.adv_estimator=grpo", "rollout.n=2", "distillation.enabled=True",
                   "distillation.teacher_key=data_source", "distillation.distillation_loss.loss_mode=k3",
                   "distillation.distillation_loss.use_task_rewards=False",
                   *(f"+distillation.teacher_models.{name}.{key}={value}" for name, source, path in teachers
                     for key, value in (("key", source), ("model_path", path), ("num_replicas", 1))))
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("reference: ")]
    assert line.startswith("reference: the distillation teachers ")
    assert f"{tiny_model} for openai/gsm8k" in line and f"{overconfident_student} for hiyouga/geometry3k" in line
    kl = [m["actor/distillation_kl"] for m in read_metrics(run) if "actor/distillation_kl" in m]
    assert len(kl) == 6 and kl[0] > 1.0, kl  # scored by the plain model, not by the student's copy
    assert sum(kl[-2:]) / 2 < 0.5 * sum(kl[:2]) / 2, kl
