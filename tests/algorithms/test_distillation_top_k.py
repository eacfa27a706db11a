"""Distillation's top-k forward KL (``distillation.loss = "forward_kl_topk"``, verl's loss_mode), checked
against sums written here from full logits: the teacher's k most likely tokens per position, the
student's log-softmax at them, sum_k p_teacher (log p_teacher - log p_student) floored at 0, the token
mean over the response; its gradient against the one derived by hand."""

import math

import attrs
import pytest
import torch

from rlcore.algorithms.distillation import (
    Distillation,
    StudentTopK,
    distillation_term,
    forward_kl_top_k,
    student_top_k,
    top_k_log_probs,
)
from rlcore.algorithms.objective import micro_batch_actor_loss
from rlcore.algorithms.policy_losses import vanilla
from rlcore.config.schema import JobConfig
from rlcore.training.specs import ActorAlgorithms, actor_spec

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
KEPT = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
K, VOCAB = 3, 7


def job(**distillation) -> JobConfig:
    config = JobConfig()
    return attrs.evolve(config, distillation=attrs.evolve(config.distillation, enable=True, teacher_path="teacher",
                                                          loss="forward_kl_topk", topk=K, **distillation))


def softmax(row: list[float], temperature: float) -> list[float]:
    scaled = [x / temperature for x in row]
    top = max(scaled)
    exps = [math.exp(x - top) for x in scaled]
    return [e / sum(exps) for e in exps]


def by_hand(student_logits, teacher_logits, temperature):
    """Per kept token: the teacher's top-k ids, its mass there, the student's, the floored forward KL, and
    the gradient of that KL with respect to the student's logits (d/dz_v of -sum_k p_t(k) log p_s(k) is
    (sum_k p_t(k) p_s(v) - p_t(v) [v among the k]) / temperature while the KL is above 0)."""
    out = {}
    for i, t in KEPT:
        p_s = softmax(student_logits[i][t].tolist(), temperature)
        p_t = softmax(teacher_logits[i][t].tolist(), temperature)
        top = sorted(range(VOCAB), key=lambda v: -p_t[v])[:K]
        kl = sum(p_t[v] * (math.log(p_t[v]) - math.log(p_s[v])) for v in top)
        mass = sum(p_t[v] for v in top)
        grad = [(mass * p_s[v] - (p_t[v] if v in top else 0.0)) / temperature if kl > 0 else 0.0
                for v in range(VOCAB)]
        own = sorted(range(VOCAB), key=lambda v: -p_s[v])[:K]
        out[i, t] = {"ids": top, "kl": max(kl, 0.0), "teacher_mass": mass, "student_mass": sum(p_s[v] for v in top),
                     "overlap": len(set(top) & set(own)), "grad": grad}
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_top_k_forward_kl_and_its_gradient_are_the_hand_computed_ones(temperature):
    torch.manual_seed(0)
    student_logits = torch.randn(2, 3, VOCAB, dtype=torch.float64, requires_grad=True)
    teacher_logits = 2 * torch.randn(2, 3, VOCAB, dtype=torch.float64)
    expected = by_hand(student_logits.detach(), teacher_logits, temperature)

    teacher_lp, teacher_ids = top_k_log_probs(teacher_logits, K, temperature)  # (B, T, K) each
    for (i, t), hand in expected.items():
        assert teacher_ids[i, t].tolist() == hand["ids"]
        assert teacher_lp[i, t].exp().sum().item() == pytest.approx(hand["teacher_mass"], rel=1e-6)
    at_ids, overlap = student_top_k(student_logits, teacher_ids, temperature)
    log_prob = torch.zeros(2, 3, dtype=torch.float64)  # the sampled tokens' log-probs: unused by this loss
    term, metrics = distillation_term(log_prob, log_prob, log_prob, MASK, job().distillation, job().actor,
                                      Distillation(None, None, top_k=K),
                                      student=StudentTopK(at_ids, overlap), teacher_top_k=teacher_lp)
    kl = [hand["kl"] for hand in expected.values()]
    assert term.item() == pytest.approx(sum(kl) / 5, rel=1e-5)
    assert metrics["distillation_loss"] == pytest.approx(sum(kl) / 5, rel=1e-5)
    assert metrics["distillation_teacher_mass"] == pytest.approx(
        sum(h["teacher_mass"] for h in expected.values()) / 5, rel=1e-5)
    assert metrics["distillation_student_mass"] == pytest.approx(
        sum(h["student_mass"] for h in expected.values()) / 5, rel=1e-5)
    assert metrics["distillation_overlap_ratio"] == pytest.approx(
        sum(h["overlap"] for h in expected.values()) / 5 / K)
    term.backward()
    grad = torch.zeros(2, 3, VOCAB, dtype=torch.float64)
    for (i, t), hand in expected.items():
        grad[i, t] = torch.tensor(hand["grad"], dtype=torch.float64) / 5  # the token mean over 5 tokens
    torch.testing.assert_close(student_logits.grad, grad, rtol=1e-5, atol=1e-7)  # padding untouched


def test_a_student_with_more_mass_on_the_teachers_top_k_than_the_teacher_scores_zero_there():
    """Over only k tokens the two masses differ, so the sum can be negative: it is floored at 0, with no
    gradient from that token (as verl)."""
    teacher_logits = torch.tensor([[[2.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0]]], dtype=torch.float64)
    student_logits = torch.tensor([[[5.0, 4.0, 3.5, 0.0, 0.0, 0.0, 0.0]]], dtype=torch.float64, requires_grad=True)
    teacher_lp, ids = top_k_log_probs(teacher_logits, K, 1.0)
    at_ids, overlap = student_top_k(student_logits, ids, 1.0)
    raw = (teacher_lp.exp() * (teacher_lp - at_ids)).sum(-1)
    assert raw.item() < 0 and overlap.item() == K
    zero = torch.zeros(1, 1, dtype=torch.float64)
    term, _ = distillation_term(zero, zero, zero, torch.ones(1, 1), job().distillation, job().actor,
                                Distillation(None, None, top_k=K),
                                student=StudentTopK(at_ids, overlap), teacher_top_k=teacher_lp)
    assert term.item() == 0.0 and forward_kl_top_k(at_ids, teacher_lp).item() == 0.0
    term.backward()
    assert torch.count_nonzero(student_logits.grad) == 0


def test_the_actors_loss_is_the_top_k_term_from_the_teachers_columns_and_clamps_apply():
    """micro_batch_actor_loss reads ref_topk_log_probs; distillation alone is the whole loss;
    log_prob_min_clamp floors both sides' log-probs and loss_max_clamp the per-token KL."""
    torch.manual_seed(2)
    student_logits = 3 * torch.randn(2, 3, VOCAB, dtype=torch.float64)
    teacher_logits = 3 * torch.randn(2, 3, VOCAB, dtype=torch.float64)
    teacher_lp, ids = top_k_log_probs(teacher_logits, K, 1.0)
    at_ids, overlap = student_top_k(student_logits, ids, 1.0)
    table = {"response_mask": MASK, "advantages": torch.zeros(2, 3, dtype=torch.float64),
             "old_log_probs": torch.zeros(2, 3, dtype=torch.float64),
             "ref_log_prob": torch.zeros(2, 3, dtype=torch.float64), "ref_topk_log_probs": teacher_lp}
    config = job(use_task_rewards=False, log_prob_min_clamp=-2.0, loss_max_clamp=0.5)
    unused = torch.zeros(2, 3, dtype=torch.float64)  # the sampled tokens' log-probs and the entropy
    spec = actor_spec(config, ActorAlgorithms(vanilla, None, Distillation(None, None, top_k=K)))
    loss, metrics = micro_batch_actor_loss(unused, unused, lambda *keys: [table[k] for k in keys], spec,
                                           student_top_k=StudentTopK(at_ids, overlap))
    per_token = []
    for i, t in KEPT:
        s = [max(x, -2.0) for x in at_ids[i, t].tolist()]
        p = [max(x, -2.0) for x in teacher_lp[i, t].tolist()]
        kl = max(sum(math.exp(pk) * (pk - sk) for pk, sk in zip(p, s)), 0.0)
        per_token.append(min(kl, 0.5))
    assert loss.item() == pytest.approx(sum(per_token) / 5, rel=1e-6)
    assert metrics["distillation_loss"] == pytest.approx(sum(per_token) / 5, rel=1e-6)
