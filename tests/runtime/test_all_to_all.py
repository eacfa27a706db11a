"""``rlcore.api.all_to_all``, the exchange Ulysses (fsdp) and context parallelism (megatron) share: on
3 gloo ranks, each rank's output is every rank's slice for it, in rank order, and the gradient comes
back by the reverse exchange; the expected values are written out slice by slice here."""

from __future__ import annotations

import pytest
import torch

from tests.runtime import all_to_all_ranks as ranks
from tests.ranks import run_ranks

WORLD = 3


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("all-to-all")
    run_ranks("tests.runtime.all_to_all_ranks", str(out), world=WORLD)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def test_each_rank_gets_every_ranks_slice_for_it_in_rank_order(results):
    tensors = [ranks.inputs(r)[0] for r in range(WORLD)]
    for r, result in enumerate(results):
        assert result["output"].shape == (6, 2, 4)
        for i in range(WORLD):  # rows 2i, 2i+1 of rank r's output: rank i's columns 2r, 2r+1
            assert torch.equal(result["output"][2 * i:2 * i + 2], tensors[i][:, 2 * r:2 * r + 2])


def test_the_gradient_returns_to_the_rank_and_place_it_came_from(results):
    weights = [ranks.inputs(r)[1] for r in range(WORLD)]
    for r, result in enumerate(results):
        for j in range(WORLD):  # rank r's columns 2j, 2j+1 went to rank j, as its rows 2r, 2r+1
            assert torch.equal(result["grad"][:, 2 * j:2 * j + 2], weights[j][2 * r:2 * r + 2])


def test_a_dimension_that_does_not_split_over_the_ranks_is_refused_naming_it(results):
    for result in results:
        assert result["error"] == ("all_to_all: dimension 1 of a (2, 5, 4) tensor does not split into 3 equal "
                                   "parts, one per rank of the group")
