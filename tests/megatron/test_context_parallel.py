"""Context parallelism in the megatron backend: megatron-core's split of a sequence over the CP ranks,
the reorderings around rlcore's Ulysses attention, the attention itself and the log-prob gathering on 2
CPU ranks (gloo), the layout and the settings: none of that needs megatron-core. With it, the model
megatron-core builds at CP 2 on 2 CPU ranks (its forward needs a GPU: ``test_on_device.py``)."""

from __future__ import annotations

import json
import os
import sys

import attrs
import pytest
import torch

from rlcore.errors import RlcoreError
from rlcore_megatron.config_map import check_parallel_sizes, model_shape, transformer_config_kwargs
from rlcore_megatron.context_parallel import (
    causal_attention,
    gathered_positions,
    local_positions,
    owned_positions,
    padded_length,
    split_sequence,
)
from tests.conftest import REPO
from tests.megatron import context_parallel_ranks as ranks
from tests.megatron.conftest import checkpoint_tensors, needs_megatron
from tests.processes import run_process
from tests.ranks import run_ranks


# -- megatron-core's split ------------------------------------------------------------------------------
def test_each_rank_holds_chunk_r_and_chunk_2cp_minus_1_minus_r():
    # 16 tokens in 2 x cp chunks: megatron-core's load-balanced order (get_batch_on_this_cp_rank)
    assert local_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert local_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert local_positions(8, 4, 0).tolist() == [0, 7]
    assert local_positions(8, 4, 3).tolist() == [3, 4]
    assert local_positions(6, 1, 0).tolist() == list(range(6))


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_the_ranks_share_every_position_once_and_the_reorder_round_trips(cp):
    length = 2 * cp * 3
    gathered = gathered_positions(length, cp)
    assert sorted(gathered.tolist()) == list(range(length))
    sequence = torch.arange(100, 100 + length)
    exchanged = torch.cat([split_sequence(sequence[None], cp, rank)[0] for rank in range(cp)])
    assert exchanged.tolist() == (gathered + 100).tolist()
    natural = torch.argsort(gathered)
    assert exchanged[natural].tolist() == sequence.tolist()
    assert exchanged[natural][gathered].tolist() == exchanged.tolist()


def test_a_length_is_padded_to_whole_chunks_and_a_ragged_one_is_refused():
    assert [padded_length(n, 2) for n in (1, 4, 5, 14, 16)] == [4, 4, 8, 16, 16]
    assert padded_length(14, 1) == 14
    with pytest.raises(ValueError, match="14 tokens does not split into 4 equal chunks"):
        local_positions(14, 2, 0)


def test_split_sequence_takes_the_rank_tokens_along_the_sequence_dimension():
    rows = torch.arange(2 * 8).reshape(2, 8)
    assert split_sequence(rows, 2, 1).tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    assert split_sequence(rows.T, 2, 0, dim=0).T.tolist() == [[0, 1, 6, 7], [8, 9, 14, 15]]


def test_owned_positions_name_the_holding_rank_and_its_offset():
    positions = torch.tensor([[0, 3, 4, 7], [5, 6, 1, 2]])
    owned, offsets = owned_positions(positions, 8, 2, 0)  # rank 0 holds 0, 1, 6, 7
    assert owned.tolist() == [[True, False, False, True], [False, True, True, False]]
    assert offsets[owned].tolist() == [0, 3, 2, 1]
    owned1, _ = owned_positions(positions, 8, 2, 1)
    assert (owned ^ owned1).all()


# -- the attention ----------------------------------------------------------------------------------------
def looped_causal_attention(query, key, value, scale):
    """Per query token and head: softmax over the keys up to it, from the definition."""
    s, b, heads, d = query.shape
    per_group = heads // key.shape[2]
    out = torch.zeros_like(query)
    for batch in range(b):
        for head in range(heads):
            for t in range(s):
                keys = key[: t + 1, batch, head // per_group]
                weights = torch.softmax(keys @ query[t, batch, head] * scale, dim=0)
                out[t, batch, head] = weights @ value[: t + 1, batch, head // per_group]
    return out


def test_causal_attention_with_grouped_keys_is_the_definition():
    whole = ranks.whole_inputs()
    got = causal_attention(whole["query"], whole["key"], whole["value"], 0.3, 0.0)
    want = looped_causal_attention(whole["query"], whole["key"], whole["value"], 0.3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("context-parallel")
    run_ranks("tests.megatron.context_parallel_ranks", str(out))
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("groups", [2, 1])  # a key/value group per rank; one group both ranks need
def test_ulysses_attention_on_two_ranks_is_whole_sequence_attention_and_its_gradient(two_ranks, groups):
    whole = {name: tensor.clone().requires_grad_(name in ("query", "key", "value"))
             for name, tensor in ranks.whole_inputs(groups).items()}
    context = causal_attention(whole["query"], whole["key"], whole["value"], ranks.HEAD_DIM ** -0.5, 0.0)
    context = context.reshape(ranks.LENGTH, ranks.BATCH, -1)
    (context * whole["weight"]).sum().backward()
    for result in two_ranks:
        mine, got = result["tokens"], result[groups]
        torch.testing.assert_close(got["context"], context.detach()[mine], atol=1e-5, rtol=1e-5)
        for name in ("query", "key", "value"):
            torch.testing.assert_close(got[name], whole[name].grad[mine], atol=1e-5, rtol=1e-5)


def test_gathered_positions_reach_every_rank_and_their_gradient_the_holder_once(two_ranks):
    whole = ranks.whole_inputs()
    positions = whole["positions"]
    want = torch.stack([whole["outputs"][row, positions[row]] for row in range(ranks.BATCH)])
    grad = torch.zeros(ranks.BATCH, ranks.LENGTH, ranks.VOCAB)
    for row in range(ranks.BATCH):
        for j, position in enumerate(positions[row].tolist()):
            grad[row, position] += whole["pick_weight"][row, j]
    for result in two_ranks:
        torch.testing.assert_close(result["picked"], want)
        torch.testing.assert_close(result["outputs_grad"], grad[:, result["tokens"]])


# -- settings and layout -----------------------------------------------------------------------------------
def qwen2(heads: int, groups: int):
    from transformers import Qwen2Config

    return model_shape(Qwen2Config(vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=heads, num_key_value_heads=groups))


def test_context_parallel_must_divide_each_tensor_parallel_ranks_heads_and_fit_its_groups():
    check_parallel_sizes(qwen2(8, 4), 2, 1, "actor.megatron", context_parallel=2)  # 4 heads, 2 groups per rank
    check_parallel_sizes(qwen2(8, 2), 2, 1, "actor.megatron", context_parallel=2)  # 1 group, repeated
    check_parallel_sizes(qwen2(8, 2), 1, 1, "actor.megatron", context_parallel=4)  # 2 groups, each twice
    with pytest.raises(RlcoreError, match=r"actor.megatron.context_parallel_size = 2 neither divides nor is a "
                                          r"multiple of the 3 key/value groups of each of the 2 tensor-parallel "
                                          r"ranks \(6 in all\)"):
        check_parallel_sizes(qwen2(12, 6), 2, 1, "actor.megatron", context_parallel=2)
    with pytest.raises(RlcoreError, match=r"critic.megatron.context_parallel_size = 3 does not divide the 8 "
                                          r"attention heads of each of the 1 tensor-parallel ranks"):
        check_parallel_sizes(qwen2(8, 8), 1, 1, "critic.megatron", context_parallel=3)


def test_the_transformer_config_carries_the_context_parallel_size():
    shape = qwen2(4, 2)
    assert transformer_config_kwargs(shape)["context_parallel_size"] == 1
    assert transformer_config_kwargs(shape, context_parallel=2)["context_parallel_size"] == 2


def test_context_parallel_settings_are_the_actors_unless_set_and_count_in_the_layout(tmp_path):
    from rlcore.config import load_job
    from rlcore.plugins.manager import get_manager
    from rlcore.training.specs import training_spec
    from rlcore_megatron.backend import MegatronBackend
    from rlcore_megatron.options import context_parallel_size

    job = load_job(None, ["trainer.backend=megatron", "trainer.n_gpus_per_node=8",
                          "actor_rollout_ref.actor.megatron.context_parallel_size=2",
                          "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"],
                   manager=get_manager(), check=False)
    config = job.config
    assert [context_parallel_size(config, s) for s in ("actor.megatron", "ref.megatron", "critic.megatron")] == \
        [2, 2, 2]
    assert MegatronBackend().describe_layout(training_spec(config, "actor"), 8) == \
        "tensor parallel 2 x pipeline parallel 1 x context parallel 2 x data parallel 2"
    sections = dict(config.sections)
    sections["critic.megatron"] = attrs.evolve(sections["critic.megatron"], context_parallel_size=4)
    assert context_parallel_size(attrs.evolve(config, sections=sections), "critic.megatron") == 4


@pytest.mark.parametrize("override", [
    "actor_rollout_ref.actor.megatron.context_parallel_size=2",
    "actor_rollout_ref.actor.megatron.override_transformer_config.context_parallel_size=2",
    "actor_rollout_ref.actor.engine.cp=2",  # verl's megatron-lite engine
])
def test_verls_context_parallel_keys_land_on_the_actors_setting(override):
    from rlcore.config import load_job
    from rlcore.plugins.manager import get_manager

    job = load_job(None, ["trainer.backend=megatron", override], manager=get_manager(), check=False)
    assert job.config.sections["actor.megatron"].context_parallel_size == 2


def test_verls_critic_and_reference_context_parallel_keys_land_on_theirs():
    from rlcore.config import load_job
    from rlcore.plugins.manager import get_manager

    job = load_job(None, ["trainer.backend=megatron", "critic.megatron.context_parallel_size=2",
                          "actor_rollout_ref.ref.megatron.context_parallel_size=2"], manager=get_manager(), check=False)
    assert job.config.sections["critic.megatron"].context_parallel_size == 2
    assert job.config.sections["ref.megatron"].context_parallel_size == 2
    assert job.config.sections["actor.megatron"].context_parallel_size is None


def test_verls_choice_of_context_parallel_algorithm_is_ignored_as_tuning():
    from rlcore.config.overrides import parse_override, translate_verl

    for key, value in (("context_parallel_algo", "kvallgather_cp_algo"), ("cp_partition_mode", "contiguous")):
        override = f"actor_rollout_ref.actor.megatron.override_transformer_config.{key}={value}"
        kept, warnings, _, problems = translate_verl([parse_override(override)])
        assert (kept, problems) == ([], [])
        assert warnings[0].startswith(f"verl key actor_rollout_ref.actor.megatron.override_transformer_config.{key} "
                                      "is ignored (tuning: ")


def test_megatron_core_builds_rlcores_attention_at_cp_2_and_the_weights_round_trip(tiny_model_path, tmp_path):
    needs_megatron()
    out = tmp_path / "cp2.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = run_process([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          str(REPO / "tests/megatron/cp_build_ranks.py"), str(out), str(tiny_model_path)],
                         name="torchrun of tests/megatron/cp_build_ranks.py (context parallel 2, gloo)", timeout=300,
                         env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [r["layout"] for r in data["ranks"]] == [[2, 0, 1], [2, 1, 1]]  # CP 2 x data parallel 1
    for rank in data["ranks"]:
        assert rank["config_cp"] == 2 and rank["replica"] == [0, 1]
        assert rank["core_attention"] == ["rlcore_megatron.context_parallel.Ulysses"] * 2  # both layers
    hf = checkpoint_tensors(tiny_model_path)
    assert data["streamed"].keys() == hf.keys()
    assert all(torch.equal(torch.tensor(data["streamed"][name]), hf[name]) for name in hf)
