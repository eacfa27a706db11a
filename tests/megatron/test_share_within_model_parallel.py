"""An update's batch that divides over megatron's data-parallel groups but not over its workers: on
four CPU ranks (gloo) under megatron-core's own parallel state, every data-parallel group puts
together the same number of rows, each row trained by exactly one group, and every rank gets its own
rows back; with one group, the group trains on the whole batch in order, as one GPU does."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.megatron.conftest import needs_megatron
from tests.processes import run_process

REPO = Path(__file__).resolve().parents[2]


def test_uneven_shares_put_together_as_each_data_parallel_groups_equal_part(tmp_path):
    needs_megatron()
    out = tmp_path / "shares.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = run_process([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4",
                          str(REPO / "tests/megatron/share_ranks.py"), str(out)],
                         name="torchrun of tests/megatron/share_ranks.py (4 gloo ranks)", timeout=300, env=env,
                         cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(out.read_text())
    for index, (tp, pp, rows) in enumerate(data["layouts"]):
        ranks = [per_rank[index] for per_rank in data["ranks"]]
        # the backend's groups are megatron's data-parallel ranks
        assert [r["group"] for r in ranks] == [r["dp_rank"] for r in ranks], (tp, pp)
        groups = {r["group"] for r in ranks}
        unions = {g: [r["union"] for r in ranks if r["group"] == g] for g in groups}
        for g, seen in unions.items():
            assert all(union == seen[0] for union in seen)  # a model-parallel group computes the same rows
            assert len(seen[0]) == rows // len(groups)  # every group an equal part
            assert seen[0] == sorted(row for r in ranks if r["group"] == g for row in r["given"])
        assert sorted(row for seen in unions.values() for row in seen[0]) == list(range(rows))  # each row once
        assert all(r["own"] == r["given"] for r in ranks)  # each rank's rows come back to it
        given = [len(r["given"]) for r in ranks]
        if rows % len(ranks):
            assert max(given) > min(given)  # the case this is about: shares that differ in length
        if len(groups) == 1:
            assert unions[0][0] == list(range(rows))  # one group: the whole batch in order, as on one GPU
