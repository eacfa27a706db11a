"""Qwen3-MoE in the megatron backend, on the CPU: the config mapping, Hugging Face <-> Megatron
weights with each expert-parallel rank's share of the experts (plain tensors), and, with
megatron-core, the ``GPTModel`` it builds at expert parallel 1 (in this process) and 2 (two gloo
ranks) holds exactly the converted tensors and gives back the folder's weights.

Not checked here: a forward pass (megatron-core's forward needs CUDA), so neither log-probs against
transformers nor expert parallel 2 against 1 in losses: ``test_on_device.py`` checks those on GPUs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import attrs
import pytest
import torch
from transformers import Qwen3Config, Qwen3MoeConfig

from rlcore.errors import RlcoreError
from rlcore_megatron.config_map import (
    Experts,
    MoeSettings,
    check_parallel_sizes,
    model_shape,
    moe_kwargs,
    transformer_config_kwargs,
)
from rlcore_megatron.weights import hf_to_megatron, megatron_to_hf, stage_names, tp_merge, tp_shard
from tests.megatron.conftest import checkpoint_tensors, needs_megatron
from tests.megatron.test_model import one_rank_layout  # noqa: F401 - the fixture
from tests.processes import run_process

REPO = Path(__file__).resolve().parents[2]
MOE = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_experts": 4,
       "num_experts_per_tok": 2, "tie_word_embeddings": False}


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_a_qwen3_moe_maps_to_megatrons_softmax_top_k_router_without_aux_loss(norm_topk_prob):
    shape = model_shape(Qwen3MoeConfig(**MOE, norm_topk_prob=norm_topk_prob))
    assert shape.experts == Experts(count=4, top_k=2, ffn_hidden_size=16, norm_top_k=norm_topk_prob)
    assert shape.qk_layernorm and not shape.qkv_bias
    kwargs = transformer_config_kwargs(shape, dtype=torch.float32, expert_parallel=2)
    assert {k: kwargs[k] for k in ("num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk",
                                   "moe_router_score_function", "moe_router_pre_softmax",
                                   "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_grouped_gemm",
                                   "expert_model_parallel_size", "qk_layernorm")} == {
        "num_moe_experts": 4, "moe_ffn_hidden_size": 16, "moe_router_topk": 2, "moe_router_score_function": "softmax",
        # top k of the logits then their softmax = the chosen probabilities renormalised
        "moe_router_pre_softmax": not norm_topk_prob, "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0, "moe_grouped_gemm": False, "expert_model_parallel_size": 2, "qk_layernorm": True}


def test_a_dense_qwen3_has_query_key_norms_and_no_experts():
    shape = model_shape(Qwen3Config(**{k: v for k, v in MOE.items() if "expert" not in k and "moe" not in k}))
    assert shape.qk_layernorm and shape.experts is None
    assert "num_moe_experts" not in transformer_config_kwargs(shape)


def test_layouts_the_experts_cannot_take_are_refused_naming_the_key():
    with pytest.raises(RlcoreError, match="dense layers between the mixture-of-experts layers"):
        model_shape(Qwen3MoeConfig(**MOE, mlp_only_layers=[0]))
    moe = model_shape(Qwen3MoeConfig(**MOE))
    with pytest.raises(RlcoreError, match=r"actor.megatron.expert_model_parallel_size = 3 does not divide the 4 "
                                          r"experts"):
        check_parallel_sizes(moe, 1, 1, "actor.megatron", expert_parallel=3)
    dense = model_shape(Qwen3Config(**{k: v for k, v in MOE.items() if "expert" not in k and "moe" not in k}))
    with pytest.raises(RlcoreError, match="needs a mixture-of-experts model; this qwen3 model is dense"):
        check_parallel_sizes(dense, 1, 1, "actor.megatron", expert_parallel=2)


@pytest.mark.parametrize("ep, tp", [(1, 1), (2, 1), (4, 1), (2, 2)])
def test_experts_split_over_expert_parallel_ranks_and_merge_back_exactly(tiny_moe_path, ep, tp):
    hf = checkpoint_tensors(tiny_moe_path)
    shape = model_shape(Qwen3MoeConfig.from_pretrained(tiny_moe_path))
    full: dict[str, torch.Tensor] = {}
    for rank in range(ep):
        share = hf_to_megatron(hf, shape, tensor_parallel=tp, expert_parallel=ep, expert_rank=rank)
        experts = {name for name in share if ".local_experts." in name}
        assert len(experts) == 2 * 2 * 4 // ep  # layers x (fc1, fc2) x this rank's experts
        assert all(int(name.split(".local_experts.")[1].split(".")[0]) in range(rank * 4 // ep, (rank + 1) * 4 // ep)
                   for name in experts)
        for name, tensor in share.items():  # through the tensor-parallel shards and back
            merged = tp_merge(name, [tp_shard(name, tensor, tp, r) for r in range(tp)])
            assert torch.equal(full.setdefault(name, merged), merged)
    back = megatron_to_hf(full, shape)
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[name], hf[name]) for name in hf)
    assert len(stage_names(shape)) == len(full)


def test_per_expert_tensors_fill_transformers_fused_experts_as_its_own_loading_does(tiny_moe_path):
    """The hf rollout engine's copy of a megatron actor takes the streamed per-expert tensors into
    transformers' module, which holds each layer's experts fused (gate_up_proj, down_proj)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlcore_megatron.weights import module_slot

    loaded = AutoModelForCausalLM.from_pretrained(tiny_moe_path, dtype=torch.float32)
    filled = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_moe_path), dtype=torch.float32)
    params = dict(filled.named_parameters())
    with torch.no_grad():
        for param in params.values():
            param.zero_()
        for name, tensor in checkpoint_tensors(tiny_moe_path).items():
            slot, value = module_slot(params, name, tensor)
            slot.copy_(value)
    assert module_slot(params, "model.layers.0.mlp.experts.9.up_proj.weight.bias", torch.zeros(1)) is None
    expected = dict(loaded.named_parameters())
    assert all(torch.equal(params[name], expected[name]) for name in expected)


def test_the_moe_gpt_model_holds_the_converted_weights_and_gives_them_back(
        tiny_moe_path, one_rank_layout):  # noqa: F811 - the fixture imported above
    needs_megatron()
    from rlcore_megatron.model import HfCheckpoint, build_model, hf_weight_stream, load_hf_weights, shape_of

    _, shape = shape_of(str(tiny_moe_path), False)
    model = build_model(shape, one_rank_layout, torch.float32, torch.device("cpu"))
    assert {name for name, _ in model.named_parameters()} == set(stage_names(shape))
    load_hf_weights(model, HfCheckpoint(str(tiny_moe_path)), shape, one_rank_layout)
    back = dict(hf_weight_stream(model, shape, one_rank_layout, torch.float32))
    hf = checkpoint_tensors(tiny_moe_path)
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[name], hf[name]) for name in hf)


def test_expert_parallel_2_on_two_cpu_ranks_holds_half_the_experts_each_and_gives_back_every_weight(
        tiny_moe_path, tmp_path):
    needs_megatron()
    out = tmp_path / "ep2.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = run_process([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          str(REPO / "tests/megatron/moe_ranks.py"), str(out), str(tiny_moe_path), "2"],
                         name="torchrun of tests/megatron/moe_ranks.py (expert parallel 2, gloo)", timeout=300,
                         env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["layout"] == [2, 0]
    for names in data["names"]:  # each rank: experts 0 and 1 of its own share, numbered locally
        experts = sorted({name.split(".local_experts.")[1].split(".")[0] for name in names if "local_experts" in name})
        assert experts == ["0", "1"]
    hf = checkpoint_tensors(tiny_moe_path)
    assert data["streamed"].keys() == hf.keys()
    assert all(torch.equal(torch.tensor(data["streamed"][name]), hf[name]) for name in hf)


def test_the_moe_settings_reach_megatrons_router_and_dispatcher_and_the_reference_takes_the_actors(
        tiny_moe_path, one_rank_layout):  # noqa: F811 - the fixture imported above
    needs_megatron()
    from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher

    from rlcore_megatron.model import build_model, shape_of
    from rlcore_megatron.options import MegatronOptions, moe_settings
    from tests.fsdp.helpers import job

    actor = MegatronOptions(moe_router_dtype="fp64", moe_aux_loss_coeff=0.01, moe_z_loss_coeff=0.001,
                            moe_token_dispatcher_type="allgather")
    config = attrs.evolve(job(tiny_moe_path), sections={"actor.megatron": actor, "ref.megatron": MegatronOptions()})
    settings = moe_settings(config, "ref.megatron", torch.device("cpu"))
    assert settings == moe_settings(config, "actor.megatron", torch.device("cpu"))
    _, shape = shape_of(str(tiny_moe_path), False)
    model = build_model(shape, one_rank_layout, torch.float32, torch.device("cpu"), moe=settings)
    for layer in model.decoder.layers:
        moe = layer.mlp
        assert isinstance(moe.token_dispatcher, MoEAllGatherTokenDispatcher)
        assert len(moe.experts.local_experts) == 4  # one SwiGLU MLP per expert (no grouped GEMM)
        config = moe.router.config
        assert (config.moe_router_dtype, config.moe_aux_loss_coeff, config.moe_z_loss_coeff,
                config.moe_router_load_balancing_type) == ("fp64", 0.01, 0.001, "aux_loss")
        assert moe.router.is_aux_loss_enabled()
    # unset: no load-balancing loss, the router in the model's dtype, on a GPU the alltoall dispatcher
    assert moe_settings(job(tiny_moe_path), "actor.megatron", torch.device("cuda")) == MoeSettings("alltoall")
    assert moe_kwargs(shape.experts, 1)["moe_router_load_balancing_type"] == "none"


def test_a_moe_model_trains_without_tensor_parallelism_only():
    shape = model_shape(Qwen3MoeConfig(**MOE))
    with pytest.raises(RlcoreError, match=r"actor.megatron.tensor_model_parallel_size = 2: a mixture of experts under "
                                          r"tensor parallelism needs megatron-core's sequence parallelism"):
        check_parallel_sizes(shape, 2, 1, "actor.megatron")
    check_parallel_sizes(shape, 1, 2, "actor.megatron", expert_parallel=4, expert_tensor_parallel=1)
    with pytest.raises(RlcoreError, match=r"actor.megatron.expert_tensor_parallel_size = 2: rlcore splits each expert "
                                          r"over the tensor-parallel ranks like the dense layers \(1\)"):
        check_parallel_sizes(shape, 1, 1, "actor.megatron", expert_tensor_parallel=2)
    dense = model_shape(Qwen3Config(**{k: v for k, v in MOE.items() if "expert" not in k and "moe" not in k}))
    check_parallel_sizes(dense, 2, 1, "actor.megatron", expert_tensor_parallel=1)  # no experts: nothing to split


def test_a_moe_model_exports_as_a_folder_transformers_loads_with_the_same_weights(
        tiny_moe_path, one_rank_layout, tmp_path):  # noqa: F811 - the fixture imported above
    """The export the actor writes (export_hf), from megatron-core's model on the CPU: config naming
    Qwen3MoeForCausalLM, one tensor per expert, equal to the folder it was loaded from."""
    needs_megatron()
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from rlcore_megatron.checkpoint import export_huggingface
    from rlcore_megatron.model import HfCheckpoint, build_model, load_hf_weights, shape_of

    hf_config, shape = shape_of(str(tiny_moe_path), False)
    model = build_model(shape, one_rank_layout, torch.float32, torch.device("cpu"))
    load_hf_weights(model, HfCheckpoint(str(tiny_moe_path)), shape, one_rank_layout)
    role = SimpleNamespace(gpt=model, shape=shape, layout=one_rank_layout, compute_dtype=torch.float32,
                           value_head=False, hf_config=hf_config, path=str(tiny_moe_path))
    export_huggingface(role, tmp_path / "export")
    assert json.loads((tmp_path / "export" / "config.json").read_text())["architectures"] == ["Qwen3MoeForCausalLM"]
    exported, original = checkpoint_tensors(tmp_path / "export"), checkpoint_tensors(tiny_moe_path)
    assert exported.keys() == original.keys() and all(torch.equal(exported[n], original[n]) for n in original)
    ids = torch.arange(3, 19).reshape(2, 8)
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(input_ids=ids).logits
                  for folder in (tiny_moe_path, tmp_path / "export")]
    assert torch.equal(*logits)


def test_a_moe_critic_exports_as_a_token_classifier_transformers_loads_whole(
        tiny_moe_path, one_rank_layout, tmp_path):  # noqa: F811 - the fixture imported above
    needs_megatron()
    from types import SimpleNamespace

    from transformers import AutoModelForTokenClassification

    from rlcore_megatron.checkpoint import export_huggingface
    from rlcore_megatron.model import HfCheckpoint, build_model, load_hf_weights, shape_of

    hf_config, shape = shape_of(str(tiny_moe_path), False)
    model = build_model(shape, one_rank_layout, torch.float32, torch.device("cpu"), value_head=True)
    load_hf_weights(model, HfCheckpoint(str(tiny_moe_path)), shape, one_rank_layout, value_head=True, seed=3)
    role = SimpleNamespace(gpt=model, shape=shape, layout=one_rank_layout, compute_dtype=torch.float32,
                           value_head=True, hf_config=hf_config, path=str(tiny_moe_path))
    export_huggingface(role, tmp_path / "critic")
    critic, info = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic", dtype=torch.float32,
                                                                   output_loading_info=True)
    assert type(critic).__name__ == "Qwen3MoeForTokenClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(critic.score.weight, dict(model.named_parameters())["output_layer.weight"])
