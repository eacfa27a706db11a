"""Sequence packing, dynamic batch size and offload on one rank: each gives what the padded,
fixed-size, resident path gives."""

from __future__ import annotations

import pytest
import torch

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.testing import build_actor, build_critic, build_reference
from rlcore_fsdp.batching import balanced_partition, micro_batches, token_costs
from rlcore_fsdp.packing import pack
from tests.fsdp.helpers import PROMPT_LENGTH, RESPONSE_LENGTH, full_weights, job, make_batch
from tests.fsdp.test_actor import capture_gradients, plain_log_probs, with_advantages


def packed_job(model_path, **kwargs):
    import attrs

    config = job(model_path, **kwargs)
    return attrs.evolve(config, model=attrs.evolve(config.model, use_remove_padding=True))


def test_packing_keeps_only_real_tokens_with_per_sample_positions():
    batch = make_batch(4)
    rows = pack(batch, torch.device("cpu"))
    lengths = batch["attention_mask"].sum(-1)
    assert rows.input_ids.shape == (1, int(lengths.sum()))
    assert rows.cu_seqlens.tolist() == [0, *lengths.cumsum(0).tolist()]
    starts = rows.cu_seqlens[:-1].long()
    assert rows.position_ids[0, starts].tolist() == [0, 0, 0, 0]  # every sample starts at position 0
    assert torch.equal(rows.targets, batch["responses"][batch["response_mask"].bool()])
    # each predictor is the packed position right before its target
    assert torch.equal(rows.input_ids[0, rows.predictors + 1], rows.targets)


def test_balanced_partition_spreads_tokens_evenly():
    costs = [9, 1, 8, 2, 7, 3, 6, 4, 5, 5]
    groups = balanced_partition(costs, 2)
    assert sorted(i for g in groups for i in g) == list(range(10))
    assert [sum(costs[i] for i in g) for g in groups] == [25, 25]


def test_dynamic_micro_batches_fit_the_budget_and_cover_every_row_once():
    batch = make_batch(8)
    costs = token_costs(batch, packed=True)
    micros = micro_batches(batch, None, 24, packed=True)
    assert sorted(torch.cat([m.rows for m in micros]).tolist()) == list(range(8))
    assert all(sum(costs[i] for i in m.rows.tolist()) <= 24 for m in micros)
    assert len(micros) == -(-sum(costs) // 24)  # as few as the budget allows
    padded = micro_batches(batch, None, 3 * (PROMPT_LENGTH + RESPONSE_LENGTH), packed=False)
    assert [len(m.rows) for m in padded] == [3, 3, 2]  # padded rows cost their full width
    with pytest.raises(RlcoreError, match="does not fit actor.ppo_max_token_len_per_gpu = 8"):
        micro_batches(batch, None, 8, packed=True, budget_name="actor.ppo_max_token_len_per_gpu")


@pytest.mark.parametrize("temperature, micro", [(1.0, None), (0.7, 2)])
def test_packed_log_probs_equal_the_padded_ones(backend, platform, tiny_model_path, temperature, micro):
    rollout = {"temperature": temperature, "log_prob_micro_batch_size_per_gpu": micro}
    batch = make_batch(5)
    mask = batch["response_mask"].bool()
    padded = build_actor(backend, job(tiny_model_path, rollout=rollout), platform).compute_log_prob(batch)
    packed = build_actor(backend, packed_job(tiny_model_path, rollout=rollout), platform).compute_log_prob(batch)
    expected, _ = plain_log_probs(tiny_model_path, batch, platform.device(), temperature)
    for key in ("old_log_probs", "entropys"):
        torch.testing.assert_close(packed[key][mask], padded[key][mask], atol=1e-5, rtol=1e-5)
        assert torch.all(packed[key][~mask] == 0)
    torch.testing.assert_close(packed["old_log_probs"][mask], expected[mask], atol=1e-5, rtol=1e-5)
    reference = build_reference(backend, packed_job(tiny_model_path, rollout=rollout), platform)
    torch.testing.assert_close(reference.compute_ref_log_prob(batch)["ref_log_prob"][mask],
                               padded["old_log_probs"][mask], atol=1e-5, rtol=1e-5)


def test_packed_rows_work_for_the_llama_family(backend, platform, tiny_llama_path):
    """SmolLM2 is a Llama: its forward calls ``create_causal_mask`` on whatever mask it is given (a
    ``{layer type: None}`` dict, which Qwen2 accepts, failed there)."""
    batch = make_batch(5)
    mask = batch["response_mask"].bool()
    padded = build_actor(backend, job(tiny_llama_path), platform).compute_log_prob(batch)
    packed = build_reference(backend, packed_job(tiny_llama_path), platform).compute_ref_log_prob(batch)
    torch.testing.assert_close(packed["ref_log_prob"][mask], padded["old_log_probs"][mask], atol=1e-5, rtol=1e-5)


def test_packed_values_equal_the_padded_ones(backend, platform, tiny_model_path):
    batch = make_batch(5)
    padded = build_critic(backend, job(tiny_model_path), platform).compute_values(batch)["values"]
    packed = build_critic(backend, packed_job(tiny_model_path), platform).compute_values(batch)["values"]
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)


def one_step(backend, platform, config, batch, advantages):
    actor = build_actor(backend, config, platform)
    grads = capture_gradients(actor)
    metrics = actor.update(with_advantages(actor, batch, advantages))
    return metrics, grads, full_weights(actor)


def assert_same_step(got, expected, grad_tol=1e-6):
    (metrics, grads, weights), (metrics_0, grads_0, weights_0) = got, expected
    assert metrics["actor/grad_norm"] == pytest.approx(metrics_0["actor/grad_norm"], rel=1e-5)
    assert metrics["actor/pg_loss"] == pytest.approx(metrics_0["actor/pg_loss"], rel=1e-5, abs=1e-7)
    for name, grad in grads_0.items():
        torch.testing.assert_close(grads[name], grad, atol=grad_tol, rtol=1e-4)
    for name, value in weights_0.items():  # Adam's first step is ~lr * sign(grad): noise flips near-0s
        torch.testing.assert_close(weights[name], value, atol=5e-5, rtol=0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_packed_dynamic_micro_batches_give_the_fixed_padded_gradient(backend, platform, tiny_model_path, mode):
    """8 rows of 7 to 14 real tokens: the whole mini-batch padded in one micro-batch, against packed
    rows in micro-batches of at most 30 tokens (3 of them, of 3, 2 and 3 rows), and against padded
    rows within a 42-token budget (3 rows of width 14 each)."""
    batch = make_batch(8)
    advantages = torch.linspace(-1.0, 1.0, 8 * RESPONSE_LENGTH).view(8, RESPONSE_LENGTH)
    base = {"ppo_mini_batch_size": 8, "loss_agg_mode": mode, "entropy_coeff": 0.01}
    fixed = one_step(backend, platform, job(tiny_model_path, actor=base), batch, advantages)
    dynamic = {**base, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 30}
    assert_same_step(one_step(backend, platform, packed_job(tiny_model_path, actor=dynamic), batch, advantages),
                     fixed)
    assert_same_step(one_step(backend, platform, job(tiny_model_path, actor={**dynamic, "ppo_max_token_len_per_gpu": 42}),
                              batch, advantages), fixed)


def test_critic_packed_dynamic_step_equals_the_fixed_padded_one(backend, platform, tiny_model_path):
    batch = make_batch(8)
    returns = torch.linspace(-1.0, 1.0, 8).unsqueeze(-1).expand(8, RESPONSE_LENGTH).contiguous()
    results = []
    for config in (job(tiny_model_path, actor={"ppo_mini_batch_size": 8}),
                   packed_job(tiny_model_path, actor={"ppo_mini_batch_size": 8},
                              critic={"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 30})):
        critic = build_critic(backend, config, platform)
        step = batch.update(critic.compute_values(batch)).update(Batch({"returns": returns}))
        metrics = critic.update(step)
        results.append((metrics, full_weights(critic)))
    (dynamic, dynamic_weights), (fixed, fixed_weights) = results[1], results[0]
    assert dynamic["critic/vf_loss"] == pytest.approx(fixed["critic/vf_loss"], rel=1e-5)
    assert dynamic["critic/grad_norm"] == pytest.approx(fixed["critic/grad_norm"], rel=1e-5)
    for name, value in fixed_weights.items():
        torch.testing.assert_close(dynamic_weights[name], value, atol=5e-5, rtol=0)


@pytest.mark.parametrize("offload", [{"param_offload": True}, {"optimizer_offload": True}])
def test_offload_runs_and_gives_the_same_steps(backend, platform, tiny_model_path, offload):
    """Two steps (the second uses AdamW's state from the first) with FSDP2's CPU offload, or with the
    optimizer state parked in CPU memory between updates, equal the resident run."""
    from rlcore_fsdp.options import FsdpOptions

    batch = make_batch(4)
    results = []
    for fsdp in (FsdpOptions(), FsdpOptions(**offload)):
        actor = build_actor(backend, job(tiny_model_path, sections={"actor.fsdp": fsdp}), platform)
        for _ in range(2):
            metrics = actor.update(with_advantages(actor, batch, torch.ones(4, RESPONSE_LENGTH)))
        results.append((metrics, full_weights(actor)))
    states = [s for state in actor.optimizer.state.values() for k, s in state.items() if k != "step"]
    assert states and all(s.device.type == "cpu" for s in states)  # the offloaded run's AdamW state
    (resident, resident_weights), (offloaded, offloaded_weights) = results
    assert offloaded["actor/grad_norm"] == pytest.approx(resident["actor/grad_norm"], rel=1e-5)
    for name, value in resident_weights.items():
        torch.testing.assert_close(offloaded_weights[name], value, atol=1e-6, rtol=1e-5)


def test_the_varlen_path_lays_out_heads_as_the_per_sample_path(monkeypatch):
    """The FlashAttention varlen kernel needs an accelerator; a stand-in with its signature (packed
    (T, H, D) inputs, cu_seqlens, grouped-query heads) checks the layout around it on the CPU."""
    import torch.nn.functional as F

    from rlcore_fsdp import attention

    def varlen_stand_in(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), enable_gqa=False, scale=None):
        assert window_size == (-1, 0) and q.is_contiguous()
        bounds = cu_q.tolist()
        outs = [F.scaled_dot_product_attention(*(x[s:e].transpose(0, 1) for x in (q, k, v)), is_causal=True,
                                               scale=scale, enable_gqa=enable_gqa).transpose(0, 1)
                for s, e in zip(bounds[:-1], bounds[1:])]
        return torch.cat(outs)

    monkeypatch.setattr(attention, "_VARLEN", varlen_stand_in)
    monkeypatch.setattr(attention, "_VARLEN_TAKES", {"causal": {"window_size": (-1, 0)}, "gqa": True, "scale": True})
    g = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, 11, 8, generator=g)  # (1, H, T, D)
    key, value = (torch.randn(1, 2, 11, 8, generator=g) for _ in range(2))  # 2 kv heads
    cu_seqlens = torch.tensor([0, 5, 6, 11], dtype=torch.int32)
    expected = attention._per_sample(query, key, value, cu_seqlens, 0.3, None)
    got = attention._varlen(query, key, value, cu_seqlens, 5, 0.3)
    torch.testing.assert_close(got, expected)
    module = torch.nn.Module()
    out, _ = attention.packed_attention_forward(module, query, key, value, None, scaling=0.3,
                                                cu_seq_lens_q=cu_seqlens, max_length_q=5)
    assert out.shape == (1, 11, 4, 8)  # fp32 on the CPU: the per-sample path
