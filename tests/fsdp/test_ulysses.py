"""Ulysses sequence parallelism: two ranks that split every packed sequence between them (one SP group
of 2, gloo on the CPU) against one rank without it: the same log-probs, values, losses, gradients and
weights after a step, for the actor (by rows and by token budget), the reference and the critic.

The 2-rank run is ``tests/fsdp/ulysses_ranks.py``, started once for the module.
"""

from __future__ import annotations

import pytest
import torch

from rlcore.config import load_job
from rlcore.errors import ConfigError
from rlcore.plugins.manager import PluginManager
from rlcore.testing import build_actor, build_critic, build_reference
from tests.fsdp import two_ranks, ulysses_ranks
from tests.fsdp.helpers import make_batch
from tests.fsdp.test_two_ranks import across_ranks, assert_same_step
from tests.ranks import run_ranks


@pytest.fixture(scope="module")
def one_kv_head_llama(tmp_path_factory):
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("ulysses-models") / "llama-kv1", family="llama", num_kv_heads=1)


@pytest.fixture(scope="module")
def split(tiny_model_path, one_kv_head_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("ulysses")
    run_ranks("tests.fsdp.ulysses_ranks", str(tiny_model_path), str(out), str(one_kv_head_llama))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def cpu():
    from rlcore.plugins.manager import get_manager

    return get_manager().get("platforms", "cpu")()


def _both(results: list[dict], key: str) -> torch.Tensor:
    return torch.cat([results[0][key], results[1][key]])


@pytest.mark.parametrize("run", ulysses_ranks.RUNS, ids=[r[0] for r in ulysses_ranks.RUNS])
def test_a_split_sequence_gives_the_one_rank_log_probs_and_step(backend, cpu, tiny_model_path, split, run):
    name, actor_settings = run
    batch = make_batch(two_ranks.ROWS)
    actor = build_actor(backend, ulysses_ranks.config(tiny_model_path, actor_settings, 1), cpu)
    expected = two_ranks.actor_step(actor, batch, two_ranks.advantages())
    got = across_ranks(split, name)
    assert_same_step(got, expected)
    assert expected["grads"] and set(got["grads"]) == set(expected["grads"])
    mask = batch["response_mask"].bool()
    log_probs = torch.cat([split[0][name]["log_probs"], split[1][name]["log_probs"]])
    torch.testing.assert_close(log_probs[mask], actor.compute_log_prob(batch)["old_log_probs"][mask],
                               atol=1e-5, rtol=1e-5)
    assert torch.isfinite(log_probs).all() and (log_probs[mask] < 0).all()
    # 4 exchanges per attention (q, k, v, output), 2 layers, forward and backward: the sequence was split
    assert split[0]["exchanges"] == split[1]["exchanges"] > 100


def test_the_reference_and_the_critic_split_sequences_too(backend, cpu, tiny_model_path, split):
    batch = make_batch(two_ranks.ROWS)
    job = ulysses_ranks.config(tiny_model_path, ulysses_ranks.RUNS[0][1], 1)
    mask = batch["response_mask"].bool()
    ref = build_reference(backend, job, cpu).compute_ref_log_prob(batch)["ref_log_prob"]
    torch.testing.assert_close(_both(split, "ref_log_probs")[mask], ref[mask], atol=1e-5, rtol=1e-5)
    critic = build_critic(backend, job, cpu)
    values = critic.compute_values(batch)["values"]
    torch.testing.assert_close(_both(split, "values")[mask], values[mask], atol=1e-5, rtol=1e-5)
    expected = two_ranks.critic_step(critic, batch, two_ranks.returns())
    assert_same_step(across_ranks(split, "critic"), expected, prefix="critic", loss="vf_loss")


def test_the_top_k_distillation_loss_splits_sequences_too(backend, cpu, tiny_model_path, one_kv_head_llama, split):
    """The teacher's top-k tokens and log-probs, and the actor's step on the top-k forward KL, on split
    sequences equal the one-rank ones."""
    batch = make_batch(two_ranks.ROWS)
    job = ulysses_ranks.top_k_config(tiny_model_path, one_kv_head_llama, 1)
    expected = ulysses_ranks.top_k_step(backend, cpu, job, batch)
    mask = batch["response_mask"].bool()
    for key in ("ref_log_prob", "ref_topk_ids", "ref_topk_log_probs"):
        got = torch.cat([split[0]["top_k"]["teacher"][key], split[1]["top_k"]["teacher"][key]])
        assert got.shape == expected["teacher"][key].shape
        torch.testing.assert_close(got[mask], expected["teacher"][key][mask], atol=1e-5, rtol=1e-5)
    got = across_ranks(split, "top_k")
    assert_same_step(got, expected)
    assert got["metrics"]["actor/distillation_loss"] == pytest.approx(expected["metrics"]["actor/distillation_loss"],
                                                                      rel=1e-5)
    assert expected["metrics"]["actor/distillation_loss"] > 0


def test_uneven_shares_pool_and_come_back_to_their_ranks(backend, cpu, tiny_model_path, split):
    batch = make_batch(two_ranks.ROWS)
    job = ulysses_ranks.config(tiny_model_path, {**ulysses_ranks.RUNS[0][1], "calculate_sum_pi_squared": True}, 1)
    expected = build_actor(backend, job, cpu).compute_log_prob(batch)
    assert [len(r["uneven_log_probs"]) for r in split] == [5, 3]
    mask = batch["response_mask"].bool()
    for key, column in (("uneven_log_probs", "old_log_probs"), ("uneven_sum_pi_squared", "sum_pi_squared")):
        torch.testing.assert_close(_both(split, key)[mask], expected[column][mask], atol=1e-5, rtol=1e-5)
    assert (_both(split, "uneven_sum_pi_squared")[mask] > 0).all()


def test_a_llama_with_fewer_key_value_heads_than_ranks_gives_the_one_rank_step(backend, cpu, one_kv_head_llama,
                                                                               split):
    actor = build_actor(backend, ulysses_ranks.config(one_kv_head_llama, ulysses_ranks.RUNS[0][1], 1), cpu)
    expected = two_ranks.actor_step(actor, make_batch(two_ranks.ROWS), two_ranks.advantages())
    assert_same_step(across_ranks(split, "llama"), expected)


def test_sequence_parallelism_needs_packed_rows_and_whole_groups():
    with pytest.raises(ConfigError) as info:
        load_job(None, ["actor.ulysses_sequence_parallel_size=2", "trainer.n_gpus_per_node=3"],
                 manager=PluginManager(), check=True, machine=False)
    problems = "\n".join(info.value.problems)
    assert "model.use_remove_padding = true" in problems
    assert "must divide the 3 training workers" in problems
