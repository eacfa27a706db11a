"""Hybrid sharding (``fsdp_size``, verl's ``fsdp_config.fsdp_size``): two ranks holding one replica
each (``fsdp_size = 1``) take the step one rank takes over the whole batch."""

from __future__ import annotations

import pytest
import torch

from rlcore.testing import build_actor
from tests.fsdp import hybrid_ranks, two_ranks
from tests.fsdp.helpers import make_batch
from tests.fsdp.test_two_ranks import across_ranks, assert_same_step
from tests.ranks import run_ranks


@pytest.fixture(scope="module")
def hybrid(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("hybrid")
    run_ranks("tests.fsdp.hybrid_ranks", str(tiny_model_path), str(out))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_two_replicas_give_the_one_rank_step(backend, tiny_model_path, hybrid):
    from rlcore.plugins.manager import get_manager

    cpu = get_manager().get("platforms", "cpu")()
    for result in hybrid:  # a 2-D mesh: replicated over the 2 groups, sharded within each group of 1
        assert result["mesh_shape"] == (2, 1) and result["placements"] == ["Replicate", "Shard"]
    actor = build_actor(backend, hybrid_ranks.config(tiny_model_path, -1), cpu)
    expected = two_ranks.actor_step(actor, make_batch(two_ranks.ROWS), two_ranks.advantages())
    assert_same_step(across_ranks([{"step": r} for r in hybrid], "step"), expected)


def test_verls_fsdp_size_lands_on_each_roles_fsdp_setting():
    from rlcore.config import load_job
    from rlcore.plugins.manager import PluginManager

    job = load_job(None, ["actor_rollout_ref.actor.fsdp_config.fsdp_size=8", "actor_rollout_ref.ref.fsdp_config.fsdp_size=4",
                          "critic.model.fsdp_config.fsdp_size=2"], manager=PluginManager(), check=False)
    config = job.config
    assert [config.sections[s].fsdp_size for s in ("actor.fsdp", "ref.fsdp", "critic.fsdp")] == [8, 4, 2]


def test_the_shard_groups_are_fsdp_size_ranks_and_must_divide_them():
    from rlcore.errors import RlcoreError
    from rlcore_fsdp.distributed import shard_group_size

    assert [shard_group_size(8, size) for size in (-1, 2, 4, 8, 16)] == [8, 2, 4, 8, 8]
    with pytest.raises(RlcoreError, match="fsdp_size = 3 does not divide the 8 training ranks"):
        shard_group_size(8, 3)
