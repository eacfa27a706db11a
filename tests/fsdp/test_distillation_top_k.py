"""The top-k forward KL (``distillation.loss = "forward_kl_topk"``) on the fsdp backend: the teacher (a
reference role) returns its top-k tokens and log-probs per response position, the ones transformers'
full logits give; the actor's distillation loss is the forward KL over them computed from both models'
full logits here; padded rows and packed rows alike."""

from __future__ import annotations

import pytest
import torch

from rlcore.batch import Batch
from rlcore.testing import build_actor, build_reference
from rlcore.workers.teachers import build_teachers
from tests.fsdp.helpers import RESPONSE_LENGTH, evolve, job, make_batch

K = 5
ROWS = 4


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("top-k") / "teacher", seed=21)


def _distilling(student_path, teacher_path, packed: bool, **distillation):
    config = evolve(job(student_path, actor={"ppo_mini_batch_size": ROWS, "ppo_micro_batch_size_per_gpu": ROWS}),
                    distillation={"enable": True, "teacher_path": str(teacher_path), "loss": "forward_kl_topk",
                                  "topk": K, "use_task_rewards": False, **distillation})
    return evolve(config, model={"use_remove_padding": packed})


def full_log_probs(model_path, batch: Batch) -> torch.Tensor:
    """log-softmax (B, R, V) over the whole vocabulary at each response position, from transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    return logits[:, -RESPONSE_LENGTH - 1:-1].log_softmax(-1)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_teacher_returns_its_top_k_tokens_and_log_probs(backend, platform, tiny_model_path, teacher_path,
                                                            packed):
    batch = make_batch(ROWS)
    reference = build_reference(backend, _distilling(tiny_model_path, teacher_path, packed), platform)
    scored = reference.compute_ref_log_prob(batch)
    expected = full_log_probs(teacher_path, batch)  # (B, R, V)
    top_values, top_ids = expected.topk(K, dim=-1)
    mask = batch["response_mask"].bool()
    assert scored["ref_topk_ids"].shape == scored["ref_topk_log_probs"].shape == (ROWS, RESPONSE_LENGTH, K)
    assert torch.equal(scored["ref_topk_ids"][mask], top_ids[mask])
    torch.testing.assert_close(scored["ref_topk_log_probs"][mask], top_values[mask], atol=1e-5, rtol=1e-5)
    sampled = expected.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(scored["ref_log_prob"][mask], sampled[mask], atol=1e-5, rtol=1e-5)


def test_several_teachers_give_each_row_its_own_teachers_top_k(backend, platform, tiny_model_path, teacher_path):
    sources = ["math", "other", "math", "other"]
    batch = make_batch(ROWS)
    batch = Batch(batch.tensors, batch.rows | {"data_source": sources}, batch.meta)
    config = _distilling(tiny_model_path, teacher_path, False, teachers={"math": str(tiny_model_path)})
    scored = build_teachers(config, platform, backend).compute_ref_log_prob(batch)
    for row, path in enumerate([tiny_model_path, teacher_path, tiny_model_path, teacher_path]):
        values, ids = full_log_probs(path, batch)[row].topk(K, dim=-1)
        kept = batch["response_mask"][row].bool()
        assert torch.equal(scored["ref_topk_ids"][row][kept], ids[kept])
        torch.testing.assert_close(scored["ref_topk_log_probs"][row][kept], values[kept], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_actors_loss_is_the_forward_kl_over_the_teachers_top_k(backend, platform, tiny_model_path, teacher_path,
                                                                   packed):
    config = _distilling(tiny_model_path, teacher_path, packed)
    batch = make_batch(ROWS)
    teacher = build_reference(backend, config, platform).compute_ref_log_prob(batch)
    actor = build_actor(backend, config, platform)
    step = batch.update(actor.compute_log_prob(batch)).update(teacher).update(
        Batch({"advantages": torch.zeros(ROWS, RESPONSE_LENGTH)}))
    metrics = actor.update(step)

    student, teacher_full = full_log_probs(tiny_model_path, batch), full_log_probs(teacher_path, batch)
    top_teacher, ids = teacher_full.topk(K, dim=-1)
    per_token = (top_teacher.exp() * (top_teacher - student.gather(-1, ids))).sum(-1).clamp_min(0)  # (B, R)
    mask = batch["response_mask"].bool()
    expected = per_token[mask].mean().item()  # token-mean over the mini-batch's response tokens
    assert expected > 1e-3  # near-uniform tiny models: the top 5 of ~500 tokens hold ~1% of the mass
    assert metrics["actor/distillation_loss"] == pytest.approx(expected, rel=1e-4)
    assert metrics["actor/distillation_teacher_mass"] == pytest.approx(
        top_teacher.exp().sum(-1)[mask].mean().item(), rel=1e-4)
    assert 0 <= metrics["actor/distillation_overlap_ratio"] <= 1
    after = full_log_probs_of(actor, batch)
    moved = (top_teacher.exp() * (top_teacher - after.gather(-1, ids))).sum(-1).clamp_min(0)[mask].mean().item()
    assert moved < expected  # one step along the gradient lowers the KL


def full_log_probs_of(actor, batch: Batch) -> torch.Tensor:
    """The trained actor's log-softmax (B, R, V), from its gathered weights in a plain transformers model."""
    from transformers import AutoModelForCausalLM

    from tests.fsdp.helpers import full_weights

    model = AutoModelForCausalLM.from_pretrained(actor.spec.path, dtype=torch.float32)
    model.load_state_dict(full_weights(actor), strict=False)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    return logits[:, -RESPONSE_LENGTH - 1:-1].log_softmax(-1)
