"""The torchtitan actor on 2 gloo ranks (FSDP2 by torchtitan's apply_fsdp_to_decoder): each rank holds
half of each weight, its log-probs equal transformers', and one update on two halves of a batch is the
update of one rank on the whole batch."""

from __future__ import annotations

import pytest

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
    weights = {name: tensor for bucket in one_rank.weights_for_rollout(1 << 20) for name, tensor in bucket}
    assert two["weights"].keys() == weights.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(two["weights"][name], tensor, atol=1e-6, rtol=1e-5, msg=name)
    assert two["metrics"]["actor/grad_norm"] == pytest.approx(metrics["actor/grad_norm"], rel=1e-4)
    # the driver averages the ranks' metrics (rlcore.workers.group.reduce_metrics): the loss of the whole batch
    ranks = [torch.load(f"{out}.metrics{rank}", weights_only=False) for rank in (0, 1)]
    for name in ("actor/pg_loss", "actor/entropy"):
        assert sum(r[name] for r in ranks) / 2 == pytest.approx(metrics[name], rel=1e-4), name
