"""Balancing a batch's tokens over the workers (``trainer.balance_batch``, as verl's).

The worker group hands worker k the k-th of equal consecutive slices of the batch. Responses differ
in length, so without care one worker can get most of the long rows and the others wait for it in
every collective. ``balanced_order`` reorders the rows so that each slice holds nearly the same
number of tokens; every later computation is per row or per group (by ``uid``), so the order does
not change what is computed, only who computes it.
"""

from __future__ import annotations

from collections.abc import Sequence


def balanced_order(lengths: Sequence[int], parts: int) -> list[int]:
    """Row indices whose ``parts`` consecutive equal slices have nearly equal total length.

    Longest rows first, each goes to the slice with the fewest tokens that still has room (ties: the
    lower slice); each slice keeps its rows in their original order. Where that lowers neither the
    largest slice's total nor the spread between the largest and the smallest, the given order is
    kept. ``len(lengths)`` must divide by ``parts``.
    """
    if parts < 1 or len(lengths) % parts:
        raise ValueError(f"{len(lengths)} rows do not divide into {parts} equal slices")
    size = len(lengths) // parts
    totals, members = [0] * parts, [[] for _ in range(parts)]
    for row in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        slot = min((p for p in range(parts) if len(members[p]) < size), key=lambda p: (totals[p], p))
        members[slot].append(row)
        totals[slot] += lengths[row]
    order = [row for rows in members for row in sorted(rows)]
    given = _slice_totals(lengths, range(len(lengths)), parts)
    if (max(given), max(given) - min(given)) <= (max(totals), max(totals) - min(totals)):
        return list(range(len(lengths)))  # the given order is already as good: keep it
    return order


def _slice_totals(lengths: Sequence[int], order: Sequence[int], parts: int) -> list[int]:
    size = len(lengths) // parts
    return [sum(lengths[i] for i in order[p * size:(p + 1) * size]) for p in range(parts)]


def balance_metrics(lengths: Sequence[int], order: Sequence[int], parts: int) -> dict[str, float]:
    """verl's ``global_seqlen/*``: the slices' token totals before (``min``, ``max``,
    ``minmax_diff``) and after (``balanced_min``, ``balanced_max``) reordering, and their ``mean``."""
    before, after = _slice_totals(lengths, range(len(lengths)), parts), _slice_totals(lengths, order, parts)
    return {"global_seqlen/min": min(before), "global_seqlen/max": max(before),
            "global_seqlen/minmax_diff": max(before) - min(before), "global_seqlen/balanced_min": min(after),
            "global_seqlen/balanced_max": max(after), "global_seqlen/mean": sum(before) / parts}
