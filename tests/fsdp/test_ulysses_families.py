"""The model families (tests/families.py) under Ulysses sequence parallelism: two ranks (gloo on the
CPU) split every packed sequence between them, and the log-probs of each rank's rows equal a plain
transformers forward (eager attention) of the whole rows. All families run in one 2-rank run
(``tests/fsdp/ulysses_families_ranks.py``): process start-up dominates on a small machine.

Ulysses needs packed rows (``model.use_remove_padding = true``), so the padded form has no Ulysses
counterpart; the one-rank padded and packed checks are tests/fsdp/test_families.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.families import FAMILIES, build_family_model
from tests.fsdp import ulysses_families_ranks as ranks
from tests.fsdp.helpers import make_batch
from tests.fsdp.test_families import ATOL, reference_log_probs
from tests.ranks import run_ranks

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ulysses-families")
    for family in FAMILIES:
        build_family_model(family, root / family)
    return root


@pytest.fixture(scope="module")
def split(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("ulysses-families-out")
    run_ranks("tests.fsdp.ulysses_families_ranks", str(models), str(out), timeout=300)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("family", FAMILIES)
def test_split_sequences_give_transformers_log_probs(models, split, family):
    got = [split[r][family] for r in range(2)]
    assert all(isinstance(g, torch.Tensor) for g in got), f"{family} failed under Ulysses: {got}"
    batch = make_batch(ranks.ROWS)
    mask = batch["response_mask"].bool()
    log_probs = torch.cat(got)
    torch.testing.assert_close(log_probs[mask], reference_log_probs(models / family, batch)[mask],
                               atol=ATOL, rtol=1e-4)
    assert torch.all(log_probs[~mask] == 0)
    # q, k, v and the output exchanged around each of the 2 layers' attention: the sequence was split
    assert split[0][f"{family}/exchanges"] == split[1][f"{family}/exchanges"] >= 4 * 2
