"""Qwen2.5-VL's shape (a vision tower attending in windows, an MLP merger): the same paths as Qwen2-VL's."""

from __future__ import annotations

import attrs
import pytest
import torch

from rlcore.data.dataset import collate
from rlcore.training.roles import SamplingParams
from rlcore.testing import build_actor, build_rollout
from tests.multimodal.helpers import RESPONSE_LENGTH, plain_log_probs, prompt_dataset, rows_of, vlm_job


@pytest.fixture(scope="module")
def qwen2_5_vl_path(tmp_path_factory):
    from rlcore.testing import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("vlm") / "tiny-qwen2.5-vl", family="qwen2_5_vl")


def test_qwen2_5_vl_log_probs_padded_and_packed_and_generation(qwen2_5_vl_path, shapes_data):
    from transformers import AutoConfig

    from rlcore.runtime.platforms import current_platform
    from rlcore.plugins.manager import get_manager

    assert AutoConfig.from_pretrained(qwen2_5_vl_path).model_type == "qwen2_5_vl"
    platform, manager = current_platform(), get_manager()
    backend = manager.get("training_backends", "fsdp")
    dataset = prompt_dataset(qwen2_5_vl_path, shapes_data["train"])
    batch = rows_of(dataset, range(5))
    mask = batch["response_mask"].bool()
    expected = plain_log_probs(qwen2_5_vl_path, batch)[mask]
    config = vlm_job(qwen2_5_vl_path)
    padded = build_actor(backend, config, platform)
    torch.testing.assert_close(padded.compute_log_prob(batch)["old_log_probs"][mask], expected, atol=1e-5, rtol=1e-5)
    packed = build_actor(backend, attrs.evolve(config, model=attrs.evolve(config.model, use_remove_padding=True)),
                         platform)
    torch.testing.assert_close(packed.compute_log_prob(batch)["old_log_probs"][mask], expected, atol=1e-5, rtol=1e-5)

    rollout = build_rollout(manager.get("rollout_engines", "hf"), config, platform, padded)
    prompts = collate(dataset, [0, 1], epoch=0)
    out = rollout.generate(prompts, SamplingParams(n=2, max_new_tokens=RESPONSE_LENGTH, temperature=1.0, top_p=1.0,
                                                   top_k=-1, do_sample=True, seed=1))
    rows = out.__class__(out.tensors, prompts.repeat_interleave(2).rows)
    generated = out["response_mask"].bool()
    torch.testing.assert_close(padded.compute_log_prob(rows)["old_log_probs"][generated],
                               out["rollout_log_probs"][generated], atol=1e-4, rtol=1e-4)
