"""The veomni actor on 2 gloo ranks, sharded by VeOmni's FSDP2 (``build_parallelize_model``), a dense Qwen3 and
a Qwen3-MoE (its fused experts sharded too): each rank holds half of the weights, its log-probs equal
transformers', and one update on two halves of a batch is the update of one rank on the whole batch."""

from __future__ import annotations

import pytest

from tests.half_batch_update import check_updated_as_one_rank
from tests.ranks import run_ranks
from tests.veomni.conftest import needs_veomni

needs_veomni()

import torch  # noqa: E402

from rlcore.runtime.platforms import CpuPlatform  # noqa: E402
from rlcore.testing import build_actor  # noqa: E402
from rlcore_veomni.backend import VeomniBackend  # noqa: E402
from tests.families import build_family_model  # noqa: E402
from tests.fsdp.helpers import job  # noqa: E402
from tests.fsdp.test_families import packed, reference_log_probs  # noqa: E402
from tests.veomni.two_ranks import update_batch  # noqa: E402


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_two_ranks_shard_the_model_and_update_as_one_rank_on_the_whole_batch(tmp_path, family):
    model = build_family_model(family, tmp_path / family)
    out = tmp_path / "rank0.pt"
    run_ranks("tests.veomni.two_ranks", str(model), str(out), timeout=240)
    two = torch.load(out, weights_only=False)
    assert any(name.startswith("veomni.models.transformers.qwen3") for name in two["classes"])

    one_rank = build_actor(VeomniBackend(), packed(job(model, lr=1e-2)), CpuPlatform())
    assert sum(two["sharded"]) * 2 == sum(p.numel() for p in one_rank.module.parameters())
    batch = update_batch(one_rank)
    mask = batch["response_mask"][:2].bool()
    torch.testing.assert_close(two["log_probs"][mask], reference_log_probs(model, batch.select(range(2)))[mask],
                               atol=1e-4, rtol=1e-4)

    metrics = one_rank.update(batch)
    # Adam's first step is lr * g / (|g| + eps): an entry whose gradient sums to ~1e-8 over the ranks in another
    # order moves by a few 1e-6 (measured: at most 5.5e-6 on one CPU, 2.8e-5 for one entry of 8192 on another,
    # with AMX); a wrong shard or a lost rank moves by ~lr = 1e-2
    check_updated_as_one_rank(two, out, one_rank, metrics, weights_atol=1e-4)
