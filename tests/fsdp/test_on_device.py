"""The backend and the hf engine in the accelerator's own dtype (bf16 compute, fp32 master weights).

Skips, saying so, on a machine without an accelerator: on the CPU ``model.dtype = "auto"`` is fp32,
which the other tests here cover.
"""

from __future__ import annotations

import pytest
import torch

from rlcore.batch import Batch
from rlcore.plugins.manager import get_manager
from rlcore.testing import build_actor, build_critic, build_reference
from rlcore.training.roles import SamplingParams
from rlcore.training.specs import rollout_spec
from tests.fsdp.helpers import RESPONSE_LENGTH, full_weights, job, make_batch


@pytest.fixture
def device_platform(platform):
    if platform.device_type == "cpu":
        pytest.skip("no accelerator on this machine: bf16 mixed precision is checked on the GPU machine")
    return platform


def test_bf16_compute_with_fp32_master_weights(backend, device_platform, tiny_model_path, tmp_path):
    config = job(tiny_model_path, dtype="auto", actor={"use_kl_loss": True})
    actor = build_actor(backend, config, device_platform)
    reference = build_reference(backend, config, device_platform)
    assert actor.compute_dtype == device_platform.default_dtype != torch.float32
    assert all(p.dtype == torch.float32 and p.device.type == device_platform.device_type
               for p in actor.module.parameters())
    assert all(p.dtype == actor.compute_dtype for p in reference.module.parameters())

    batch = make_batch(4)
    batch = batch.update(actor.compute_log_prob(batch)).update(reference.compute_ref_log_prob(batch))
    mask = batch["response_mask"].bool()
    assert batch["old_log_probs"].dtype == torch.float32
    torch.testing.assert_close(batch["old_log_probs"][mask], batch["ref_log_prob"][mask], atol=0.05, rtol=0.05)
    before = batch["old_log_probs"][mask].sum()
    for _ in range(3):
        step = batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)}))
        metrics = actor.update(step)
    assert actor.compute_log_prob(batch)["old_log_probs"][mask].sum() > before + 1.0
    assert all(v == v for v in metrics.values())  # no NaN

    engine = get_manager().get("rollout_engines", "hf")(rollout_spec(config), device_platform, actor)
    prompts = Batch({"prompts": batch["prompts"]})
    out = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=RESPONSE_LENGTH))
    assert out["responses"].shape == (8, RESPONSE_LENGTH)
    assert all(p.dtype == torch.float32 for p in actor.module.parameters())

    actor.save(str(tmp_path / "actor"))
    resumed = build_actor(backend, config, device_platform)
    resumed.load(str(tmp_path / "actor"))
    for name, value in full_weights(actor).items():
        assert torch.equal(full_weights(resumed)[name], value), name


def test_bf16_critic(backend, device_platform, tiny_model_path):
    critic = build_critic(backend, job(tiny_model_path, dtype="auto"), device_platform)
    batch = make_batch(4)
    returns = torch.linspace(-1.0, 1.0, 4).unsqueeze(-1).expand(4, RESPONSE_LENGTH).contiguous()
    losses = []
    for _ in range(8):
        step = batch.update(critic.compute_values(batch)).update(Batch({"returns": returns}))
        losses.append(critic.update(step)["critic/vf_loss"])
    assert losses[-1] < 0.5 * losses[0]


def test_packed_rows_in_bf16_match_padded_rows(backend, device_platform, tiny_model_path):
    """Packed rows run torch's varlen FlashAttention in bf16 (where torch has it): the log-probs agree
    with the padded path to bf16 precision, and a packed, dynamic update trains."""
    import attrs

    from rlcore_fsdp.attention import packed_kernel

    config = job(tiny_model_path, dtype="auto", actor={"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 40})
    packed_config = attrs.evolve(config, model=attrs.evolve(config.model, use_remove_padding=True))
    batch = make_batch(8)
    mask = batch["response_mask"].bool()
    padded = build_actor(backend, config, device_platform).compute_log_prob(batch)["old_log_probs"]
    actor = build_actor(backend, packed_config, device_platform)
    packed = actor.compute_log_prob(batch)["old_log_probs"]
    torch.testing.assert_close(packed[mask], padded[mask], atol=0.05, rtol=0.05)
    print(f"packed attention kernel on {device_platform.device_type}: {packed_kernel(device_platform.device_type)}")
    before = packed[mask].sum()
    for _ in range(3):
        step = batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": torch.ones(8, RESPONSE_LENGTH)}))
        actor.update(step)
    assert actor.compute_log_prob(batch)["old_log_probs"][mask].sum() > before + 1.0


def test_offload_keeps_parameters_and_optimizer_state_in_cpu_memory(backend, device_platform, tiny_model_path):
    from rlcore_fsdp.options import FsdpOptions

    batch = make_batch(4)
    for fsdp, params_on_cpu in ((FsdpOptions(param_offload=True), True), (FsdpOptions(optimizer_offload=True), False)):
        actor = build_actor(backend, job(tiny_model_path, dtype="auto", sections={"actor.fsdp": fsdp}),
                            device_platform)
        assert all((p.device.type == "cpu") == params_on_cpu for p in actor.module.parameters())
        step = batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)}))
        metrics = actor.update(step)
        assert metrics["actor/grad_norm"] > 0
        states = [s for state in actor.optimizer.state.values() for k, s in state.items() if k != "step"]
        assert states and all(s.device.type == "cpu" for s in states)
        buckets = list(actor.weights_for_rollout(1 << 20))
        assert all(t.device.type == device_platform.device_type for bucket in buckets for _, t in bucket)


def test_packing_and_inputs_reach_the_device_without_waiting_for_it(device_platform):
    """``pack`` works the layout out on the host and copies through pinned memory: under CUDA's sync
    debug mode "error", any wait of the host for the device (a boolean index or ``max`` of device tensors,
    a copy from pageable memory) would raise (the 1.5B trace's host waits, docs/async.md)."""
    from rlcore_fsdp.packing import pack
    from rlcore_fsdp.transfer import to_device

    if device_platform.device_type != "cuda":
        pytest.skip("CUDA's sync debug mode is CUDA's own")
    device = torch.device("cuda", torch.cuda.current_device())
    batch = make_batch(4)
    expected = pack(batch, torch.device("cpu"))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rows = pack(batch, device)
        advantages = to_device(batch["response_mask"].float(), device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for name in ("input_ids", "position_ids", "cu_seqlens", "predictors", "targets", "response_slots"):
        assert torch.equal(getattr(rows, name).cpu(), getattr(expected, name)), name
    assert rows.max_length == expected.max_length
    assert torch.equal(advantages.cpu(), batch["response_mask"].float())
