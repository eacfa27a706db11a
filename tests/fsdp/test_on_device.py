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
    from rlcore.runtime.transfer import to_device
    from rlcore_fsdp.packing import pack

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
    for name in ("input_ids", "position_ids", "cu_seqlens", "predictors", "targets", "response_index"):
        assert torch.equal(getattr(rows, name).cpu(), getattr(expected, name)), name
    assert rows.max_length == expected.max_length and rows.response_shape == expected.response_shape
    assert torch.equal(advantages.cpu(), batch["response_mask"].float())


def _host_waits(run) -> int:
    """How often ``run()`` made the host wait for the device (CUDA's sync debug mode "warn": one warning each)."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_an_update_waits_for_the_device_as_often_with_eight_micro_batches_as_with_one(backend, device_platform,
                                                                                     tiny_model_path, packed):
    """An update of 8 micro-batches waits for the device no more often than one of a single micro-batch: the
    losses' metrics stay on the device, summed there and read once a step (``read_metrics``); packed outputs
    are placed by index (a ``masked_scatter``'s gradient waited in every backward); padded rows always get
    a mask (transformers' check whether one is needed waited in every forward). Beside the engine each wait
    lasts as long as the trainer's queued kernels take in their time slices. With only the metrics kept on the
    device: 10 waits against 3, padded and packed alike (an H200, 2026-12-06)."""
    import attrs

    if device_platform.device_type != "cuda":
        pytest.skip("CUDA's sync debug mode is CUDA's own")
    batch = make_batch(8)
    waits = {}
    for micro in (8, 1):
        config = job(tiny_model_path, dtype="auto", actor={"ppo_mini_batch_size": 8, "use_kl_loss": True,
                                                           "ppo_micro_batch_size_per_gpu": micro})
        config = attrs.evolve(config, model=attrs.evolve(config.model, use_remove_padding=packed))
        actor, reference = build_actor(backend, config, device_platform), build_reference(backend, config,
                                                                                          device_platform)
        step = batch.update(actor.compute_log_prob(batch)).update(reference.compute_ref_log_prob(batch)).update(
            Batch({"advantages": torch.linspace(-1.0, 1.0, 8).unsqueeze(-1).expand(8, RESPONSE_LENGTH)}))
        actor.update(step)  # the first update allocates the optimizer's state
        metrics = {}
        waits[micro] = _host_waits(lambda: metrics.update(actor.update(step)))
        assert all(type(value) is float for value in metrics.values())
    assert waits[1] == waits[8], waits


def test_a_micro_batch_s_loss_and_rollout_correction_never_wait_for_the_device(device_platform):
    """The on-policy update weighs each micro-batch against the engine's log-probs (rollout IS) and takes its
    policy loss, entropy and their metrics without the host waiting for the device (sync debug mode
    "error" raises at any wait); the values are those computed on the CPU."""
    from rlcore.algorithms.config import AlgorithmConfig
    from rlcore.algorithms.objective import actor_loss
    from rlcore.algorithms.policy_losses import POLICY_LOSSES
    from rlcore.algorithms.rollout_correction import weigh_micro_batch
    from rlcore.config.schema import ActorConfig
    from rlcore.metrics.step import read_metrics

    if device_platform.device_type != "cuda":
        pytest.skip("CUDA's sync debug mode is CUDA's own")
    generator = torch.Generator().manual_seed(0)
    log_prob = torch.randn(6, 10, generator=generator) - 2.0
    rollout_log_prob = log_prob + 0.3 * torch.randn(6, 10, generator=generator)
    entropy, advantages = torch.rand(6, 10, generator=generator), torch.randn(6, 1, generator=generator).expand(6, 10)
    mask = torch.ones(6, 10, dtype=torch.long)
    mask[1, 4:] = 0
    mask[4] = 0  # a sequence without response tokens
    algorithm = AlgorithmConfig(rollout_is_threshold=2.0, rollout_is=True)

    def loss_and_metrics(device):
        inputs = [t.to(device) for t in (log_prob, rollout_log_prob, advantages, mask, entropy)]
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            weighted, metrics = weigh_micro_batch(inputs[0], inputs[1], inputs[2], inputs[3], algorithm)
            loss, loss_metrics = actor_loss(inputs[0], inputs[4], inputs[0], weighted, inputs[3], ActorConfig(),
                                            POLICY_LOSSES["vanilla"])
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        return float(loss), read_metrics(metrics | loss_metrics)

    on_device, on_host = loss_and_metrics(torch.device("cuda", torch.cuda.current_device())), loss_and_metrics(
        torch.device("cpu"))
    assert on_device[0] == pytest.approx(on_host[0], rel=1e-5, abs=1e-6)
    assert on_device[1].keys() == on_host[1].keys()
    for key, value in on_host[1].items():
        assert on_device[1][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
