"""The GPTModel megatron-core builds from a Hugging Face folder holds exactly the tensors the
conversion tables name, and reading them back gives the Hugging Face weights. Needs megatron-core;
runs on the CPU too (building and loading need no CUDA; the forward does)."""

from __future__ import annotations

import os
import tempfile
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from tests.megatron.conftest import needs_megatron


@pytest.fixture(scope="module")
def one_rank_layout():
    needs_megatron()
    from megatron.core import parallel_state as ps

    from rlcore_megatron.model import current_layout

    made_group = not dist.is_initialized()
    if made_group:
        store = dist.FileStore(os.path.join(tempfile.mkdtemp(prefix="rlcore-megatron-"), "store"), 1)
        dist.init_process_group(backend="gloo", store=store, rank=0, world_size=1)
    made_layout = not ps.model_parallel_is_initialized()
    if made_layout:
        ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    yield current_layout()
    # later modules (the GPU tests) set up their own groups, with the accelerator's backend
    if made_layout:
        ps.destroy_model_parallel()
    if made_group:
        dist.destroy_process_group()


@pytest.mark.parametrize("value_head", [False, True])
def test_the_built_model_holds_the_converted_weights_and_gives_them_back(tiny_model_path, one_rank_layout,
                                                                         value_head):
    from transformers import AutoModelForCausalLM

    from rlcore_megatron.model import (
        HfCheckpoint,
        build_model,
        hf_weight_stream,
        load_hf_weights,
        shape_of,
    )
    from rlcore_megatron.weights import stage_names

    _, shape = shape_of(str(tiny_model_path), False)
    model = build_model(shape, one_rank_layout, torch.float32, torch.device("cpu"), value_head=value_head)
    assert {name for name, _ in model.named_parameters()} == set(stage_names(shape, value_head=value_head))
    load_hf_weights(model, HfCheckpoint(str(tiny_model_path)), shape, one_rank_layout, value_head=value_head, seed=3)
    back = dict(hf_weight_stream(model, shape, one_rank_layout, torch.float32, value_head=value_head))
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
    expected = {name for name in hf if name != "lm_head.weight"}  # tied to the embedding
    if value_head:
        expected |= {"score.weight", "score.bias"}
        assert back["score.weight"].std() > 0 and not back["score.bias"].any()  # a new head, from the seed
    assert set(back) == expected
    assert all(torch.equal(back[name], hf[name]) for name in expected if name in hf)


def test_a_mistral_folder_builds_converts_and_writes_its_own_class_back(one_rank_layout, tmp_path):
    """The family matrix's tiny Mistral (a sliding window of 4): Llama's tensor names, read back exactly,
    and the Hugging Face config a checkpoint writes names MistralForCausalLM with the window kept."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlcore_megatron.checkpoint import write_hf_files
    from rlcore_megatron.model import HfCheckpoint, build_model, hf_weight_stream, load_hf_weights, shape_of
    from tests.families import build_family_model

    path = build_family_model("mistral", tmp_path / "mistral")
    hf_config, shape = shape_of(str(path), False)
    assert (shape.model_type, shape.sliding_window, shape.qkv_bias) == ("mistral", 4, False)
    model = build_model(shape, one_rank_layout, torch.float32, torch.device("cpu"))
    load_hf_weights(model, HfCheckpoint(str(path)), shape, one_rank_layout)
    back = dict(hf_weight_stream(model, shape, one_rank_layout, torch.float32))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    assert set(back) == set(hf) and all(torch.equal(back[name], hf[name]) for name in hf)

    # what write_hf_files reads of a trained role
    trained = SimpleNamespace(hf_config=hf_config, shape=shape, value_head=False, path=str(path))
    write_hf_files(trained, tmp_path / "out")
    written = AutoConfig.from_pretrained(tmp_path / "out")
    assert written.architectures == ["MistralForCausalLM"] and written.sliding_window == 4
