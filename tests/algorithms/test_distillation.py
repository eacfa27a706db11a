"""On-policy distillation's loss term, checked against per-token sums written here from the formulas
(k1 = log p_student - log p_teacher, PPO's loss with -k1 as the advantage), and a student that follows
the term's gradient moving toward its teacher."""

import math

import attrs
import pytest
import torch

from rlcore.algorithms.distillation import Distillation, distillation_term, reference_model_path
from rlcore.algorithms.kl import KL_ESTIMATORS
from rlcore.algorithms.objective import micro_batch_actor_loss
from rlcore.algorithms.policy_losses import vanilla
from rlcore.config.schema import JobConfig
from rlcore.training.specs import ActorAlgorithms, actor_spec

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
KEPT = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]


def job(**distillation) -> JobConfig:
    config = JobConfig()
    return attrs.evolve(config, distillation=attrs.evolve(config.distillation, enable=True, teacher_path="teacher",
                                                          **distillation))


def tables(config: JobConfig):
    """What distillation_term reads of the job: [distillation] and [actor]."""
    return config.distillation, config.actor


def spec(config: JobConfig, policy_loss, distillation=None):
    """The actor's spec the driver makes of ``config``, training with ``policy_loss`` (and ``distillation``)."""
    return actor_spec(config, ActorAlgorithms(policy_loss, None, distillation))


def columns_of(table: dict):
    return lambda *keys: [table[key] for key in keys]


def test_the_direct_term_is_the_token_mean_of_the_estimate_and_its_gradient_flows_to_the_student():
    torch.manual_seed(0)
    student = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(2, 3, dtype=torch.float64)
    term, metrics = distillation_term(student, student.detach(), teacher, MASK, *tables(job(loss="k1")),
                                      Distillation(KL_ESTIMATORS["k1"], None))
    k1 = {(i, t): student[i, t].item() - teacher[i, t].item() for i, t in KEPT}
    assert term.item() == pytest.approx(sum(k1.values()) / 5)
    assert metrics["distillation_kl"] == pytest.approx(sum(k1.values()) / 5)
    assert metrics["distillation_abs_kl"] == pytest.approx(sum(abs(v) for v in k1.values()) / 5)
    term.backward()
    expected = torch.zeros(2, 3, dtype=torch.float64)
    for i, t in KEPT:
        expected[i, t] = 1 / 5  # d(mean of lp - teacher)/d lp, padding untouched
    assert torch.allclose(student.grad, expected)


def test_clamps_bound_the_log_probs_and_the_per_token_estimate():
    student = torch.tensor([[-30.0, -1.0, 0.0], [-0.5, -2.0, -0.1]], dtype=torch.float64)
    teacher = torch.tensor([[-1.0, -40.0, 0.0], [-0.5, -1.0, -0.1]], dtype=torch.float64)
    term, _ = distillation_term(student, student, teacher, MASK, *tables(job(loss="k1", log_prob_min_clamp=-10.0,
                                                                             loss_max_clamp=5.0)),
                                Distillation(KL_ESTIMATORS["k1"], None))
    # per token: max(lp, -10) - max(teacher, -10), then clamped to [-5, 5]
    per_token = [-5.0, 5.0, 0.0, -1.0, 0.0]
    assert term.item() == pytest.approx(sum(per_token) / 5)


def test_the_policy_gradient_form_takes_minus_the_estimate_as_the_advantage():
    torch.manual_seed(1)
    student = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    old = student.detach() + 0.05 * torch.randn(2, 3, dtype=torch.float64)
    teacher = torch.randn(2, 3, dtype=torch.float64)
    term, _ = distillation_term(student, old, teacher, MASK, *tables(job(loss="k1", use_policy_gradient=True)),
                                Distillation(KL_ESTIMATORS["k1"], vanilla))
    expected = 0.0
    for i, t in KEPT:  # PPO's clipped loss (clip 0.2) of one token with advantage -(lp - teacher)
        advantage = -(student[i, t].item() - teacher[i, t].item())
        ratio = math.exp(student[i, t].item() - old[i, t].item())
        token = max(-advantage * ratio, -advantage * min(max(ratio, 0.8), 1.2))
        expected += min(token, -advantage * 3.0) if advantage < 0 else token
    assert term.item() == pytest.approx(expected / 5)
    term.backward()
    # the advantage carries no gradient: d/dlp of -A * ratio is -A * ratio, where the ratio is not clipped
    i, t = KEPT[0]
    ratio = math.exp(student[i, t].item() - old[i, t].item())
    assert student.grad[i, t].item() == pytest.approx((student[i, t].item() - teacher[i, t].item()) * ratio / 5)


def test_with_task_rewards_the_term_is_added_times_coef_else_it_is_the_whole_loss():
    torch.manual_seed(2)
    table = {key: torch.randn(2, 3) for key in ("old_log_probs", "advantages", "ref_log_prob")}
    table["response_mask"] = MASK
    log_prob, entropy = torch.randn(2, 3), torch.rand(2, 3)
    distill = Distillation(KL_ESTIMATORS["k1"], None)
    task, _ = micro_batch_actor_loss(log_prob, entropy, columns_of(table), spec(job(), vanilla))
    k1 = sum(log_prob[i, t].item() - table["ref_log_prob"][i, t].item() for i, t in KEPT) / 5
    both, metrics = micro_batch_actor_loss(log_prob, entropy, columns_of(table),
                                           spec(job(loss="k1", coef=0.5), vanilla, distill))
    assert both.item() == pytest.approx(task.item() + 0.5 * k1, rel=1e-5)
    assert "pg_loss" in metrics and metrics["distillation_loss"] == pytest.approx(k1, rel=1e-5)
    alone, _ = micro_batch_actor_loss(log_prob, entropy, columns_of(table),
                                      spec(job(loss="k1", coef=0.5, use_task_rewards=False), vanilla, distill))
    assert alone.item() == pytest.approx(k1, rel=1e-5)


def test_following_the_k3_term_moves_a_student_toward_its_teacher():
    """A categorical student over 8 tokens samples, and steps down the k3 term's gradient on its own
    samples: its exact KL to the teacher falls."""
    generator = torch.Generator().manual_seed(3)
    teacher = torch.log_softmax(torch.randn(8, generator=generator) * 2, dim=0)
    logits = torch.zeros(8, requires_grad=True)
    optimizer = torch.optim.SGD([logits], lr=0.5)

    def exact_kl() -> float:
        p = torch.log_softmax(logits.detach(), dim=0)
        return float((p.exp() * (p - teacher)).sum())

    before = exact_kl()
    config, distill = job(loss="k3"), Distillation(KL_ESTIMATORS["k3"], None)
    for _ in range(200):
        log_probs = torch.log_softmax(logits, dim=0)
        tokens = torch.multinomial(log_probs.detach().exp(), 16, replacement=True, generator=generator)
        student = log_probs[tokens].unsqueeze(0)  # (1, 16)
        term, _ = distillation_term(student, student.detach(), teacher[tokens].unsqueeze(0), torch.ones(1, 16),
                                    *tables(config), distill)
        optimizer.zero_grad()
        term.backward()
        optimizer.step()
    assert exact_kl() < 0.2 * before


def test_the_reference_loads_the_teacher_only_under_distillation():
    assert reference_model_path(job()) == "teacher"
    plain = JobConfig()
    assert reference_model_path(plain) == plain.model.path
