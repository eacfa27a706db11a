"""How an update's batch is cut over the worker ranks: equal parts for the data-parallel groups a
backend declares, each group's part spread over its ranks."""

import pytest

from rlcore.errors import RlcoreError
from rlcore.workers.group import data_parallel_shares


def rows_of_each_group(shares, groups):
    """The row indices each group receives when rank r takes the next ``shares[r]`` rows."""
    out, start = {}, 0
    for share, group in zip(shares, groups):
        out.setdefault(group, []).extend(range(start, start + share))
        start += share
    return out


def test_every_rank_its_own_group_gives_equal_consecutive_shares():
    assert data_parallel_shares(12, range(4), "update_actor") == [3, 3, 3, 3]
    with pytest.raises(RlcoreError, match=r"update_actor: 10 rows do not split evenly over 4 data-parallel groups"):
        data_parallel_shares(10, range(4), "update_actor")


@pytest.mark.parametrize(("rows", "groups", "shares"), [
    (7, [0, 0], [4, 3]),  # tensor parallel 2, one data-parallel group: 7 rows need not divide by 2
    (6, [0, 0, 1, 1], [2, 1, 2, 1]),  # tensor parallel 2 x data parallel 2
    (6, [0, 1, 0, 1], [2, 2, 1, 1]),  # pipeline parallel 2 x data parallel 2: a group's ranks are apart
    (256, [0] * 96, [3] * 64 + [2] * 32),  # verl's DeepSeek-V3 example: TP 8 x PP 12 on 96 GPUs, one group
])
def test_model_parallel_groups_take_equal_parts_spread_over_their_ranks(rows, groups, shares):
    got = data_parallel_shares(rows, groups, "update_actor")
    assert got == shares and sum(got) == rows
    parts = rows_of_each_group(got, groups)
    assert {len(part) for part in parts.values()} == {rows // len(parts)}  # every group trains on as many rows
    assert sorted(row for part in parts.values() for row in part) == list(range(rows))  # each row once
    assert max(got) - min(got) <= 1
