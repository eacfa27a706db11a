"""The torchtitan actor on 2 gloo ranks (FSDP2 by torchtitan's apply_fsdp_to_decoder): each rank holds
half of each weight, its log-probs equal transformers', and one update on two halves of a batch is the
update of one rank on the whole batch."""

from __future__ import annotations


from tests.half_batch_update import check_updated_as_one_rank
from tests.ranks import run_ranks
from tests.torchtitan.conftest import needs_torchtitan, padded_rows, transformers_log_probs

needs_torchtitan()

import torch  # noqa: E402

from rlcore.runtime.platforms import CpuPlatform  # noqa: E402
from rlcore.testing import build_actor  # noqa: E402
from rlcore_torchtitan.backend import TorchtitanBackend  # noqa: E402
from tests.torchtitan.test_roles import job, update_batch  # noqa: E402


def test_two_ranks_shard_the_model_and_update_as_one_rank_on_the_whole_batch(tiny_llama, tmp_path):
    out = tmp_path / "rank0.pt"
    run_ranks("tests.torchtitan.two_ranks", str(tiny_llama), str(out), timeout=240)
    two = torch.load(out, weights_only=False)

    one_rank = build_actor(TorchtitanBackend(), job(tiny_llama), CpuPlatform())
    whole = {p.numel() for p in one_rank.module.parameters()}
    assert sum(two["sharded"]) * 2 == sum(p.numel() for p in one_rank.module.parameters()) and whole
    batch = padded_rows()
    expected = transformers_log_probs(tiny_llama, batch)[:2]
    assert float(((two["log_probs"] - expected).abs() * batch["response_mask"][:2]).max()) < 1e-4

    metrics = one_rank.update(update_batch(one_rank))
    check_updated_as_one_rank(two, out, one_rank, metrics, weights_atol=1e-6)
