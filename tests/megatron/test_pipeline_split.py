"""Uneven pipeline stages (verl's override_transformer_config.num_layers_in_first/last_pipeline_stage):
the layers each stage holds, as rlcore computes them for the weight conversion and as megatron-core
builds them; and, on two CPU ranks, the stages megatron-core builds hold those layers and give back
every weight of the folder."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from transformers import Qwen3Config

from rlcore.errors import RlcoreError
from rlcore_megatron.config_map import PipelineSplit, check_parallel_sizes, model_shape, transformer_config_kwargs
from rlcore_megatron.weights import stage_layers, stage_names
from tests.megatron.conftest import build_tiny_qwen3_moe, checkpoint_tensors, needs_megatron
from tests.megatron.test_moe import REPO
from tests.processes import run_process

QWEN3 = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "tie_word_embeddings": False}


@pytest.mark.parametrize("layers, stages, split, sizes", [
    (4, 2, PipelineSplit(), [2, 2]),
    (94, 8, PipelineSplit(11, 11), [11, 12, 12, 12, 12, 12, 12, 11]),  # Qwen3-235B's 94 layers
    (3, 2, PipelineSplit(first=2), [2, 1]),
    (7, 3, PipelineSplit(last=1), [3, 3, 1]),
    (5, 1, PipelineSplit(first=2), [5]),  # one stage: nothing to split
    # the embedding and the loss counted as layers: Qwen3-VL-235B's 94 layers + 2 over 8 stages
    (94, 8, PipelineSplit(embedding=True, loss=True), [11, 12, 12, 12, 12, 12, 12, 11]),
    (5, 2, PipelineSplit(embedding=True), [2, 3]),
    (5, 3, PipelineSplit(loss=True), [2, 2, 1]),
])
def test_stages_hold_their_share_of_the_layers_in_order(layers, stages, split, sizes):
    assert split.sizes(layers, stages) == sizes
    ranges = [stage_layers(layers, stages, stage, split) for stage in range(stages)]
    assert [len(r) for r in ranges] == sizes and [n for r in ranges for n in r] == list(range(layers))


def test_a_split_that_does_not_divide_is_refused_naming_the_keys():
    shape = model_shape(Qwen3Config(**QWEN3, num_hidden_layers=7))
    with pytest.raises(RlcoreError, match=r"actor.megatron.num_layers_in_first/last_pipeline_stage: 7 layers do not "
                                          r"split evenly over 3 pipeline stages with 2 on the first stage"):
        check_parallel_sizes(shape, 1, 3, "actor.megatron", split=PipelineSplit(first=2))
    with pytest.raises(RlcoreError, match="pipeline_model_parallel_size = 2 does not divide the 7 layers"):
        check_parallel_sizes(shape, 1, 2, "actor.megatron")
    check_parallel_sizes(shape, 1, 2, "actor.megatron", split=PipelineSplit(first=4))
    # the layers of the first stage and of the stages between are rlcore's; the names follow them
    names = stage_names(shape, 2, 1, split=PipelineSplit(first=4))
    assert {int(n.split(".")[2]) for n in names if n.startswith("decoder.layers.")} == {4, 5, 6}


def test_counting_the_embedding_or_loss_refuses_what_megatron_core_refuses():
    shape = model_shape(Qwen3Config(**QWEN3, num_hidden_layers=6))
    with pytest.raises(RlcoreError, match=r"account_for_embedding/loss_in_pipeline_split: 6 layers and the embedding "
                                          r"and the loss \(8 counted\) do not split evenly over 3 pipeline stages"):
        check_parallel_sizes(shape, 1, 3, "actor.megatron", split=PipelineSplit(embedding=True, loss=True))
    with pytest.raises(RlcoreError, match="exclude each other"):
        PipelineSplit(first=2, loss=True).sizes(6, 2)
    with pytest.raises(RlcoreError, match="leave a stage without a layer"):
        PipelineSplit(embedding=True, loss=True).sizes(2, 4)
    assert "account_for_loss_in_pipeline_split" not in PipelineSplit(loss=True).kwargs(1)
    assert PipelineSplit(embedding=True).kwargs(2) == {"account_for_embedding_in_pipeline_split": True}


def test_megatron_core_builds_the_stages_rlcore_converts_for():
    needs_megatron()
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    both = PipelineSplit(embedding=True, loss=True)
    for layers, stages, split in ((10, 4, PipelineSplit(1, 3)), (10, 3, PipelineSplit(first=2)),
                                  (10, 2, PipelineSplit(last=3)), (10, 4, both), (10, 3, both), (10, 6, both),
                                  (11, 4, PipelineSplit(embedding=True)), (11, 3, PipelineSplit(loss=True))):
        shape = model_shape(Qwen3Config(**QWEN3, num_hidden_layers=layers))
        config = TransformerConfig(**transformer_config_kwargs(shape, pipeline_parallel=stages, dtype=torch.float32,
                                                               split=split), use_cpu_initialization=True)
        built = [range(get_transformer_layer_offset(config, pp_rank=rank),
                       get_transformer_layer_offset(config, pp_rank=rank) + get_num_layers_to_build(config, pp_rank=rank))
                 for rank in range(stages)]
        assert built == [stage_layers(layers, stages, rank, split) for rank in range(stages)], (stages, split)
        assert PipelineSplit.of(config) == split
    assert "num_layers_in_first_pipeline_stage" not in transformer_config_kwargs(shape, split=PipelineSplit(first=2))


def test_two_uneven_stages_on_two_cpu_ranks_hold_their_layers_and_give_back_every_weight(tmp_path):
    needs_megatron()
    model_path = build_tiny_qwen3_moe(tmp_path / "qwen3", experts=None, layers=3)
    out = tmp_path / "pp2.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = run_process([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          str(REPO / "tests/megatron/moe_ranks.py"), str(out), str(model_path), "1", "2", "2"],
                         name="torchrun of tests/megatron/moe_ranks.py (pipeline parallel 2, 2 + 1 layers, gloo)",
                         timeout=300, env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(out.read_text())
    layers = [sorted({int(n.split(".")[2]) for n in names if n.startswith("decoder.layers.")})
              for names in data["names"]]
    assert layers == [[0, 1], [0]]  # each stage numbers its own layers from 0: global 0, 1 and 2
    hf = checkpoint_tensors(model_path)
    assert data["streamed"].keys() == hf.keys()
    assert all(torch.equal(torch.tensor(data["streamed"][name]), hf[name]) for name in hf)


def test_verls_uneven_pipeline_keys_land_on_the_actor_and_the_reference_and_critic_take_them():
    from rlcore.config import load_job
    from rlcore_megatron.options import pipeline_split

    config = load_job(None, [
        "model_engine=megatron", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8",
        "actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage=11",
        "actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage=11"]).config
    assert {pipeline_split(config, section) for section in ("actor.megatron", "ref.megatron", "critic.megatron")} \
        == {PipelineSplit(11, 11)}
    transformer = "actor_rollout_ref.actor.megatron.override_transformer_config."
    counted = load_job(None, ["model_engine=megatron", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8",
                              f"+{transformer}account_for_loss_in_pipeline_split=True",
                              f"+{transformer}account_for_embedding_in_pipeline_split=True"]).config
    splits = {pipeline_split(counted, section) for section in ("actor.megatron", "ref.megatron", "critic.megatron")}
    assert splits == {PipelineSplit(embedding=True, loss=True)}
    assert splits.pop().sizes(94, 8) == PipelineSplit(11, 11).sizes(94, 8)  # the same stages as the script's split


def test_verls_overrides_that_restate_the_model_are_accepted_and_others_refused():
    from rlcore.config import load_job
    from rlcore.errors import ConfigError

    transformer = "actor_rollout_ref.actor.megatron.override_transformer_config."
    job = load_job(None, [f"{transformer}normalization=RMSNorm", f"{transformer}swiglu=True",
                          f"{transformer}use_distributed_optimizer=False"])
    assert job.config.section("actor.megatron").use_distributed_optimizer is False
    with pytest.raises(ConfigError, match=r"normalization='LayerNorm' is refused: the normalization is the model's "
                                          r"own \(RMSNorm\)"):
        load_job(None, [f"{transformer}normalization=LayerNorm"])
