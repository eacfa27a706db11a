"""The rollout's own model copy: takes weights by Hugging Face name (tied ones under one name) and
generates what a model holding those weights generates."""

from __future__ import annotations

import pytest
import torch

from rlcore.asynchronous.inference_copy import InferenceCopy
from rlcore.config import load_job
from rlcore.errors import RlcoreError
from rlcore.runtime.platforms import current_platform


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def test_sent_weights_replace_the_copys_own_tied_ones_too(tiny_path, tmp_path):
    from rlcore.testing import build_tiny_model
    from transformers import AutoModelForCausalLM

    config = load_job(None, [f'model.path="{tiny_path}"']).config
    copy = InferenceCopy(config, current_platform())
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "other", seed=7))
    # as an actor sends them: a tied tensor once, under its first name, in two buckets
    named = list(other.named_parameters())  # named_parameters() lists a tied tensor once
    assert copy.load(iter([named[:3], named[3:]])) == len(named)
    for name, tensor in other.state_dict().items():
        assert torch.equal(copy.tensors[name], tensor), name
    assert copy.module.lm_head.weight.data_ptr() == copy.module.model.embed_tokens.weight.data_ptr()
    prompt = torch.tensor([[5, 6, 7, 8]])
    with copy.generation_module() as module:
        mine = module.generate(prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(mine, other.eval().generate(prompt, max_new_tokens=6, do_sample=False))


def test_a_tensor_the_model_lacks_is_refused_with_its_name(tiny_path):
    config = load_job(None, [f'model.path="{tiny_path}"']).config
    copy = InferenceCopy(config, current_platform())
    with pytest.raises(RlcoreError, match=r"cannot take model.layers.9.mlp.up_proj.weight \(2, 2\) from the "
                                          r"trainer \(no such tensor\)"):
        copy.load(iter([[("model.layers.9.mlp.up_proj.weight", torch.zeros(2, 2))]]))
    with pytest.raises(RlcoreError, match=r"cannot take model.norm.weight \(3,\) from the trainer \(shape \(64,\)\)"):
        copy.load(iter([[("model.norm.weight", torch.zeros(3))]]))
