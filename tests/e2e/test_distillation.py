"""On-policy distillation as a whole job: a tiny student samples, a tiny teacher scores the samples in
the reference's place, and the student's KL to the teacher falls."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import job_overrides, read_metrics, train

TIMEOUT_S = 90  # each job's deadline: 6 or 8 steps took 9 to 11 s in the job's own process on the idle CI machine


def sharpened(tiny_model: Path, out: Path, scale: float) -> Path:
    """The tiny model with its final norm scaled by ``scale``: its logits are the plain model's times
    ``scale``, the same preferences made sharp."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(scale)
    shutil.copytree(tiny_model, out)  # the tokenizer and its chat template; the weights are replaced below
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def overconfident_student(tiny_model, tmp_path_factory) -> Path:
    """The tiny model's logits x8. Distilled from the plain model, it must flatten them back; a consistent
    direction that a few steps reach (a sharper teacher's few preferred tokens would seldom be sampled
    by a near-uniform student, whose reverse KL then barely moves)."""
    return sharpened(tiny_model, tmp_path_factory.mktemp("student") / "overconfident", 8.0)


@pytest.fixture(scope="module")
def confident_teacher(tiny_model, tmp_path_factory) -> Path:
    """The tiny model's logits x3: a teacher for the top-k forward KL, which sees only the teacher's k
    most likely tokens (a near-uniform teacher's top 16 hold ~3% of its mass, and a student that puts
    more there scores 0); the plain model learns to sharpen toward it."""
    return sharpened(tiny_model, tmp_path_factory.mktemp("teacher") / "confident", 3.0)


@pytest.mark.parametrize("loss, policy_gradient", [("k3", False), ("k1", True), ("forward_kl_topk", False)],
                         ids=["k3-loss", "k1-policy-gradient", "forward-kl-top-k"])
def test_distillation_alone_lowers_the_students_kl_to_the_teacher(overconfident_student, confident_teacher, tiny_model,
                                                                  gsm8k_parquet, tmp_path, loss, policy_gradient):
    """The k3 estimate backpropagated as a loss (verl's default loss_mode), verl's examples' form: -k1 per
    token as the advantage of a policy-gradient loss, and verl's forward_kl_topk (its megatron example's
    loss): the forward KL over the teacher's top 16 tokens per position, which the plain model lowers
    toward a sharper copy of itself (a slower direction than flattening: a smaller lr keeps Adam's steps
    from scrambling the tiny model's near-tied preferences)."""
    run = tmp_path / "distill"
    top_k = loss == "forward_kl_topk"
    student, teacher = (tiny_model, confident_teacher) if top_k else (overconfident_student, tiny_model)
    overrides = job_overrides(student, gsm8k_parquet, run, **{
        "trainer.total_training_steps": 8, "trainer.save_freq": -1, "trainer.test_freq": -1,
        "trainer.val_before_train": False, "actor.optim.lr": 2e-3 if top_k else 3e-3, "data.train_batch_size": 8,
        "actor.ppo_mini_batch_size": 8, "actor.ppo_micro_batch_size_per_gpu": 8})
    # verl's spelling, as its on-policy distillation example writes it (rollout.n = 1, GRPO unused)
    result = train(*overrides, "algorithm.adv_estimator=grpo", "rollout.n=2",
                   "distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={teacher}",
                   f"distillation.distillation_loss.loss_mode={loss}",
                   f"distillation.distillation_loss.use_policy_gradient={policy_gradient}",
                   "distillation.distillation_loss.use_task_rewards=False", "distillation.distillation_loss.topk=16",
                   timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"reference: the distillation teacher {teacher}" in result.stdout
    metrics = [m for m in read_metrics(run) if "actor/distillation_kl" in m]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert all(m["timing_s/ref"] > 0 for m in metrics)  # the teacher scored every step
    if top_k:
        forward = [m["actor/distillation_loss"] for m in metrics]  # the top-k forward KL itself
        mass = [m["actor/distillation_student_mass"] for m in metrics]  # the student's on the teacher's top 16
        assert forward[0] > 0.1, forward
        assert sum(forward[-2:]) / 2 < 0.85 * sum(forward[:2]) / 2, forward  # measured: 0.17 -> 0.13
        assert mass[-1] > mass[0] and all(0.1 < m["actor/distillation_teacher_mass"] < 0.2 for m in metrics), mass
        return
    kl = [m["actor/distillation_kl"] for m in metrics]
    assert kl[0] > 1.0, kl  # the overconfident student starts far from its teacher
    assert sum(kl[-2:]) / 2 < 0.5 * sum(kl[:2]) / 2, kl


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
                     for key, value in (("key", source), ("model_path", path), ("num_replicas", 1))),
                   timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("reference: ")]
    assert line.startswith("reference: the distillation teachers ")
    assert f"{tiny_model} for openai/gsm8k" in line and f"{overconfident_student} for hiyouga/geometry3k" in line
    kl = [m["actor/distillation_kl"] for m in read_metrics(run) if "actor/distillation_kl" in m]
    assert len(kl) == 6 and kl[0] > 1.0, kl  # scored by the plain model, not by the student's copy
    assert sum(kl[-2:]) / 2 < 0.5 * sum(kl[:2]) / 2, kl
