"""Qwen2.5-VL's shape (a vision tower attending in windows, an MLP merger) and Qwen3-VL's (patches of 16,
learned vision positions, deepstack features into the language model's first layers, interleaved 3-D
rotary sections) and Qwen3-VL-MoE's (experts in every language-model layer): the same paths as
Qwen2-VL's."""

from __future__ import annotations

import attrs
import pytest
import torch

from rlcore.data.dataset import collate
from rlcore.training.roles import SamplingParams
from rlcore.testing import build_actor, build_rollout
from tests.multimodal.helpers import RESPONSE_LENGTH, plain_log_probs, prompt_dataset, rows_of, vlm_job


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"])
def family_path(request, tmp_path_factory):
    from rlcore.testing import build_tiny_vision_model

    # Qwen3-VL's patches of 16: a 56 x 56 image becomes 64 x 64 pixels, 16 patches, 4 image tokens
    return request.param, build_tiny_vision_model(tmp_path_factory.mktemp("vlm") / request.param,
                                                  family=request.param, max_image_side=64)


def test_log_probs_padded_and_packed_and_generation(family_path, shapes_data):
    from transformers import AutoConfig

    from rlcore.runtime.platforms import current_platform
    from rlcore.plugins.manager import get_manager

    family, path = family_path
    assert AutoConfig.from_pretrained(path).model_type == family
    platform, manager = current_platform(), get_manager()
    backend = manager.get("training_backends", "fsdp")
    dataset = prompt_dataset(path, shapes_data["train"])
    batch = rows_of(dataset, range(5))
    mask = batch["response_mask"].bool()
    expected = plain_log_probs(path, batch)[mask]
    config = vlm_job(path)
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
