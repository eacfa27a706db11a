"""The fsdp actor and reference on the tiny model, one rank on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from rlcore.batch import Batch
from rlcore.testing import build_actor, build_reference
from tests.fsdp.helpers import RESPONSE_LENGTH, evolve, full_weights, job, make_batch

VERL_ACTOR_METRICS = {"actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac",
                      "actor/pg_clipfrac_lower", "actor/kl_loss", "actor/grad_norm", "actor/lr"}


def plain_log_probs(model_path, batch: Batch, device, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Response log-probs and entropy from a plain transformers forward over the full logits."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval().to(device)
    inputs = {key: batch[key].to(device) for key in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        logits = model(**inputs).logits.cpu() / temperature  # (B, P+R, V)
    log_probs = torch.log_softmax(logits[:, -RESPONSE_LENGTH - 1:-1], dim=-1)  # (B, R, V)
    chosen = log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return chosen, entropy


def capture_gradients(actor) -> dict[str, torch.Tensor]:
    """Fills with each parameter's full gradient as the optimizer steps."""
    grads: dict[str, torch.Tensor] = {}
    original = actor.optimizer.step

    def step(*args, **kwargs):
        for name, param in actor.module.named_parameters():
            grads[name] = param.grad.full_tensor().clone()
        return original(*args, **kwargs)

    actor.optimizer.step = step
    return grads


def with_advantages(actor, batch: Batch, advantages: torch.Tensor) -> Batch:
    return batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": advantages}))


def test_the_backend_is_registered_and_builds_a_sharded_actor(backend, platform, tiny_model_path):
    actor = build_actor(backend, job(tiny_model_path), platform)
    assert all(isinstance(p, DTensor) for p in actor.module.parameters())
    assert hasattr(actor.module, "generate")  # the hf engine generates with this very module


@pytest.mark.parametrize("temperature, micro", [(1.0, None), (0.7, 3)])
def test_log_probs_equal_a_plain_transformers_forward(backend, platform, tiny_model_path, temperature, micro):
    config = job(tiny_model_path, rollout={"temperature": temperature, "log_prob_micro_batch_size_per_gpu": micro})
    batch = make_batch(5)
    out = build_actor(backend, config, platform).compute_log_prob(batch)
    expected, entropy = plain_log_probs(tiny_model_path, batch, platform.device(), temperature)
    mask = batch["response_mask"].bool()
    assert out["old_log_probs"].shape == out["entropys"].shape == (5, RESPONSE_LENGTH)
    torch.testing.assert_close(out["old_log_probs"][mask], expected[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["entropys"][mask], entropy[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_the_sum_of_squared_probabilities_equals_a_plain_transformers_forward(backend, platform, tiny_model_path,
                                                                               packed):
    """actor.calculate_sum_pi_squared: sum_v softmax(logits / T)_v^2 per response position, from the
    old log-prob pass (the optimal token baseline's input), padded and packed."""
    from transformers import AutoModelForCausalLM

    config = job(tiny_model_path, actor={"calculate_sum_pi_squared": True}, rollout={"temperature": 0.7})
    config = evolve(config, model={"use_remove_padding": packed})
    batch = make_batch(5)
    out = build_actor(backend, config, platform).compute_log_prob(batch)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(**{key: batch[key] for key in ("input_ids", "attention_mask", "position_ids")}).logits
    probabilities = torch.softmax(logits[:, -RESPONSE_LENGTH - 1:-1] / 0.7, dim=-1)  # (B, R, V)
    expected = (probabilities * probabilities).sum(-1)
    mask = batch["response_mask"].bool()
    assert out["sum_pi_squared"].shape == (5, RESPONSE_LENGTH)
    torch.testing.assert_close(out["sum_pi_squared"].cpu()[mask], expected[mask], atol=1e-6, rtol=1e-5)
    assert ((expected[mask] > 0) & (expected[mask] <= 1)).all()
    assert "sum_pi_squared" not in build_actor(backend, job(tiny_model_path), platform).compute_log_prob(batch)


def test_updates_raise_the_log_prob_of_responses_with_positive_advantages(backend, platform, tiny_model_path):
    """Three training steps, each from fresh old log-probs as the trainer computes them."""
    actor = build_actor(backend, job(tiny_model_path, actor={"ppo_epochs": 2}), platform)
    batch = make_batch(4)
    mask = batch["response_mask"].bool()
    before = actor.compute_log_prob(batch)["old_log_probs"][mask]
    for _ in range(3):
        metrics = actor.update(with_advantages(actor, batch, torch.ones(4, RESPONSE_LENGTH)))
        assert metrics["actor/grad_norm"] > 0 and metrics["actor/lr"] == pytest.approx(1e-3)
    after = actor.compute_log_prob(batch)["old_log_probs"][mask]
    assert after.sum() > before.sum() + 1.0
    assert (after > before).float().mean() > 0.9


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_accumulation_gives_the_whole_batch_step(backend, platform, tiny_model_path, mode):
    """Micro-batches of 2 rows (holding 14 and 6 response tokens) accumulate to the whole batch's
    gradient: same gradients, same parameters after the step."""
    batch = make_batch(4)
    advantages = torch.linspace(-1.0, 1.0, 4 * RESPONSE_LENGTH).view(4, RESPONSE_LENGTH)
    results = []
    for micro in (None, 2):
        actor = build_actor(backend, job(tiny_model_path, actor={"ppo_micro_batch_size_per_gpu": micro,
                                                          "loss_agg_mode": mode}), platform)
        grads = capture_gradients(actor)
        metrics = actor.update(with_advantages(actor, batch, advantages))
        results.append((metrics, grads, full_weights(actor)))
    (whole, whole_grads, whole_weights), (accumulated, accumulated_grads, accumulated_weights) = results
    assert accumulated["actor/grad_norm"] == pytest.approx(whole["actor/grad_norm"], rel=1e-5)
    assert accumulated["actor/pg_loss"] == pytest.approx(whole["actor/pg_loss"], rel=1e-5, abs=1e-7)
    for name, grad in whole_grads.items():
        torch.testing.assert_close(accumulated_grads[name], grad, atol=1e-7, rtol=1e-5)
    for name, value in whole_weights.items():  # Adam's first step is ~lr * sign(grad): noise flips near-0s
        torch.testing.assert_close(accumulated_weights[name], value, atol=5e-5, rtol=0)


def test_mini_batches_make_one_optimizer_step_each(backend, platform, tiny_model_path):
    """4 rows, mini-batches of 1 prompt x 2 samples, 2 epochs: 4 steps; the schedule moves once."""
    config = job(tiny_model_path, actor={"ppo_mini_batch_size": 1, "ppo_epochs": 2}, rollout={"n": 2})
    actor = build_actor(backend, config, platform)
    steps = []
    original = actor.optimizer.step
    actor.optimizer.step = lambda *a, **k: (steps.append(1), original(*a, **k))[1]
    actor.update(with_advantages(actor, make_batch(4), torch.ones(4, RESPONSE_LENGTH)))
    assert len(steps) == 4 and actor.schedule.step == 1


def test_kl_loss_and_entropy_bonus_report_verl_metrics(backend, platform, tiny_model_path):
    config = job(tiny_model_path, actor={"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": "low_var_kl",
                                         "entropy_coeff": 0.01})
    actor = build_actor(backend, config, platform)
    reference = build_reference(backend, config, platform)
    batch = make_batch(4)
    batch = with_advantages(actor, batch, torch.zeros(4, RESPONSE_LENGTH)).update(reference.compute_ref_log_prob(batch))
    first = actor.update(batch)
    assert VERL_ACTOR_METRICS <= set(first)
    assert first["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before any step
    assert first["actor/pg_loss"] == pytest.approx(0.0, abs=1e-6)  # zero advantages
    assert first["actor/grad_norm"] > 0  # the entropy bonus alone moves the policy
    second = actor.update(batch)
    assert second["actor/kl_loss"] > 0 and second["actor/kl_coef"] == 0.1


def test_reference_log_probs_equal_the_initial_actor(backend, platform, tiny_model_path):
    config = job(tiny_model_path, actor={"use_kl_loss": True})
    batch = make_batch(3)
    actor_out = build_actor(backend, config, platform).compute_log_prob(batch)
    ref_out = build_reference(backend, evolve(config, ref={"log_prob_micro_batch_size_per_gpu": 2}), platform)
    ref_log_prob = ref_out.compute_ref_log_prob(batch)["ref_log_prob"]
    torch.testing.assert_close(ref_log_prob, actor_out["old_log_probs"])
    assert not any(p.requires_grad for p in ref_out.module.parameters())


def test_the_actor_and_reference_apply_model_override_config(backend, platform, tiny_model_path):
    """model.override_config reaches both the policy and its frozen copy: their log-probs are equal to
    each other and differ from the folder's own config's."""
    overridden = job(tiny_model_path, actor={"use_kl_loss": True})
    overridden = evolve(overridden, model={"override_config": {"rms_norm_eps": 0.5}})
    batch = make_batch(3)
    actor_out = build_actor(backend, overridden, platform).compute_log_prob(batch)["old_log_probs"]
    ref_out = build_reference(backend, overridden, platform).compute_ref_log_prob(batch)["ref_log_prob"]
    torch.testing.assert_close(ref_out, actor_out)
    plain = build_actor(backend, job(tiny_model_path), platform).compute_log_prob(batch)["old_log_probs"]
    assert not torch.allclose(plain, actor_out)


def test_weights_for_rollout_are_full_hf_named_parameters_in_bounded_buckets(backend, platform, tiny_model_path):
    from transformers import AutoModelForCausalLM

    actor = build_actor(backend, job(tiny_model_path), platform)
    plain = dict(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).named_parameters())
    limit = 40_000
    buckets = list(actor.weights_for_rollout(limit))
    for bucket in buckets:
        sizes = [t.numel() * t.element_size() for _, t in bucket]
        assert sum(sizes) <= limit or len(bucket) == 1
    weights = {name: tensor for bucket in buckets for name, tensor in bucket}
    assert set(weights) == set(plain)
    for name, tensor in weights.items():
        assert not isinstance(tensor, DTensor)
        torch.testing.assert_close(tensor.cpu(), plain[name].detach())


def test_an_on_policy_update_without_old_log_probs_equals_one_with_them(backend, platform, tiny_model_path):
    """``RolePlan.old_log_prob_pass`` off: the update takes its own forward pass's log-probs as the old
    ones. On-policy (one epoch, one mini-batch) they are what the separate pass computes, so the
    update, its metrics and the weights after it are the same."""
    config = job(tiny_model_path, actor={"ppo_mini_batch_size": 8}, lr=0.05)
    batch = make_batch(8)
    advantages = torch.linspace(-1.0, 1.0, 8).unsqueeze(-1).expand(-1, RESPONSE_LENGTH).contiguous()
    with_pass, without_pass = build_actor(backend, config, platform), build_actor(backend, config, platform)
    metrics_with = with_pass.update(with_advantages(with_pass, batch, advantages))
    metrics_without = without_pass.update(batch.update(Batch({"advantages": advantages})))
    assert metrics_without["actor/ppo_kl"] == 0.0 and metrics_without["actor/pg_clipfrac"] == 0.0
    for key, value in metrics_with.items():
        assert metrics_without[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    after_with, after_without = full_weights(with_pass), full_weights(without_pass)
    assert any(not torch.equal(after_with[k], v) for k, v in full_weights(build_actor(backend, config, platform)).items())
    for name, weight in after_with.items():
        torch.testing.assert_close(after_without[name], weight, atol=1e-6, rtol=1e-5)


def test_one_device_reduces_gradients_once_per_mini_batch_with_the_same_step(backend, platform, tiny_model_path,
                                                                             monkeypatch):
    """On one device a mini-batch's micro-batches accumulate unreduced and FSDP reduces each layer once,
    after the last (its reduction after every micro-batch only copied, at a cost of host time per layer);
    the gradients and the step are those of reducing after every micro-batch."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    reductions = []
    reduce = _fsdp_param_group.foreach_reduce
    monkeypatch.setattr(_fsdp_param_group, "foreach_reduce", lambda *a, **k: (reductions.append(1), reduce(*a, **k))[1])
    batch = make_batch(4)
    advantages = torch.linspace(-1.0, 1.0, 4 * RESPONSE_LENGTH).view(4, RESPONSE_LENGTH)
    results = []
    for once in (True, False):
        actor = build_actor(backend, job(tiny_model_path, actor={"ppo_micro_batch_size_per_gpu": 1}), platform)
        assert actor.reduce_last_micro_batch_only
        actor.reduce_last_micro_batch_only = once
        grads = capture_gradients(actor)
        reductions.clear()
        metrics = actor.update(with_advantages(actor, batch, advantages))
        results.append((len(reductions), metrics, grads, full_weights(actor)))
    (once_reductions, once, once_grads, once_weights), (each_reductions, each, each_grads, each_weights) = results
    units = 1 + actor.module.config.num_hidden_layers  # each layer, and the root (embeddings, norm, head)
    assert (once_reductions, each_reductions) == (units, 4 * units)  # 4 micro-batches of 1 row
    assert once["actor/grad_norm"] == pytest.approx(each["actor/grad_norm"], rel=1e-6)
    for name, grad in each_grads.items():
        torch.testing.assert_close(once_grads[name], grad, atol=1e-7, rtol=1e-5)
    for name, value in each_weights.items():
        torch.testing.assert_close(once_weights[name], value, atol=5e-5, rtol=0)
