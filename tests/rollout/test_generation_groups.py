"""Ranks that hold one model between them generate together: the hf engine pools a generation
group's prompts, samples them alike on every rank, and each keeps its own rows, so a seeded step
draws the same samples on one rank as on a group of two. Ranks that generate alone draw differently.

The 2-rank half is ``tests/rollout/group_ranks.py`` (two processes, gloo)."""

from __future__ import annotations

import pytest
import torch

from rlcore.training.roles import group_seed
from tests.ranks import run_ranks
from tests.rollout.group_ranks import SHARES, generate


@pytest.fixture(scope="module")
def two_ranks(tiny_model_path, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("group-ranks")
    run_ranks("tests.rollout.group_ranks", str(tiny_model_path), str(out))
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_a_group_of_two_draws_the_one_rank_samples_and_each_keeps_its_rows(two_ranks, tiny_model_path):
    one = generate(tiny_model_path, range(0, 5), None)  # one rank, all prompts, the same seed
    assert one["responses"].shape == (10, 8)
    for rank, share in enumerate(SHARES):
        mine = slice(share.start * 2, share.stop * 2)  # n = 2 samples per prompt
        together = two_ranks[rank]["together"]
        assert torch.equal(together["responses"], one["responses"][mine])
        assert torch.equal(together["response_mask"], one["response_mask"][mine])
        width = together["prompts"].shape[1]  # the group's widest prompt: the one-rank width
        assert torch.equal(together["prompts"], one["prompts"][mine][:, -width:])
    assert len({tuple(one["responses"][i].tolist()) for i in range(10)}) > 5  # sampled, not greedy


def test_ranks_that_generate_alone_draw_with_their_own_seeds(two_ranks, tiny_model_path):
    """Rank 0 alone seeds as a lone process does; rank 1 alone, on the same prompts, draws otherwise."""
    for rank, share in enumerate(SHARES):
        lone_process = generate(tiny_model_path, share, None)["responses"]
        same = torch.equal(two_ranks[rank]["alone"]["responses"], lone_process)
        assert same == (rank == 0)


def test_group_seeds_differ_between_groups_and_repeat_for_the_same_group():
    seeds = {group_seed(seed, group) for seed in range(50) for group in range(8)}
    assert len(seeds) == 400
    assert group_seed(3, 1) == group_seed(3, 1) and all(0 <= s < 2**62 for s in seeds)
