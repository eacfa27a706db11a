"""Padded rows through the trained models' attention: no query row is fully masked (the NaN
gradients of SDPA's masked backward on an H200 started there), and the numbers are transformers'."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlcore.testing import build_actor, build_critic
from rlcore_fsdp.attention import padded_mask
from tests.fsdp.helpers import job, make_batch
from tests.fsdp.test_actor import plain_log_probs


def record_sdpa_masks(monkeypatch) -> list[torch.Tensor]:
    """Fills with the boolean ``attn_mask`` of every SDPA call made from now on."""
    masks: list[torch.Tensor] = []
    original = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        if mask is not None:
            masks.append(mask.detach().clone())
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return masks


def test_no_query_of_a_padded_actor_or_critic_forward_sees_no_key(backend, platform, tiny_model_path, monkeypatch):
    batch = make_batch(6)  # rows with 1 or 2 left pads: their first queries would see only pads
    assert (batch["attention_mask"][:, 0] == 0).any()
    config = job(tiny_model_path)
    actor, critic = build_actor(backend, config, platform), build_critic(backend, config, platform)
    masks = record_sdpa_masks(monkeypatch)
    actor.compute_log_prob(batch)
    critic.compute_values(batch)
    assert masks, "the padded forwards passed SDPA no mask"
    for mask in masks:
        assert mask.dtype == torch.bool
        assert mask.any(dim=-1).all(), "a query row sees no key"


def test_padded_log_probs_still_equal_a_plain_transformers_forward(backend, platform, tiny_model_path):
    batch = make_batch(6)
    mask = batch["response_mask"].bool()
    got = build_actor(backend, job(tiny_model_path), platform).compute_log_prob(batch)
    expected, entropy = plain_log_probs(tiny_model_path, batch, platform.device())
    torch.testing.assert_close(got["old_log_probs"][mask], expected[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["entropys"][mask], entropy[mask], atol=1e-5, rtol=1e-5)


def test_the_padded_mask_is_sdpas_less_its_fully_masked_rows():
    from transformers.masking_utils import sdpa_mask

    attention_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)  # as create_causal_mask passes it
    kwargs = {"batch_size": 2, "q_length": 5, "kv_length": 5, "attention_mask": attention_mask}
    sdpa, ours = sdpa_mask(**kwargs), padded_mask(**kwargs)
    empty = ~sdpa.any(dim=-1)  # (B, 1, Q): the first row's two left pads
    assert empty.sum() == 2 and empty[0, 0, :2].all()
    assert ours[empty].all()  # those queries see every key
    assert torch.equal(ours[~empty], sdpa[~empty])  # every other query sees what it saw
    assert padded_mask(batch_size=1, q_length=5, kv_length=5) is None  # no padding: left to is_causal
    # a padding mask without pads is not read (the host would wait for the device): the causal mask itself
    unpadded = padded_mask(batch_size=1, q_length=5, kv_length=5, attention_mask=torch.ones(1, 5, dtype=torch.bool))
    assert torch.equal(unpadded[0, 0], torch.ones(5, 5, dtype=torch.bool).tril())


def test_on_cuda_masked_calls_keep_off_cudnn_and_the_cpu_leaves_the_choice_to_torch():
    from torch.nn.attention import SDPBackend

    from rlcore.runtime.platforms import CpuPlatform, CudaPlatform

    kernels = CudaPlatform().masked_attention_kernels()
    assert SDPBackend.CUDNN_ATTENTION not in kernels
    assert {SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH} <= set(kernels)
    assert CpuPlatform().masked_attention_kernels() is None
