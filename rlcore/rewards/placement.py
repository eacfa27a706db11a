"""Where a response's score goes: on its last model token, the token-level reward every estimator
reads (verl's ``token_level_scores``); and the per-sample rows the scores leave in the batch."""

from __future__ import annotations

import torch
from torch import Tensor

from rlcore.errors import RlcoreError
from rlcore.rewards.scorer import RewardResult


def last_token_scores(scores: Tensor, response_mask: Tensor) -> Tensor:
    """(B, R) float32: each row's score (B,) on its last model token, 0 elsewhere and for an empty
    response. The last model token, not the last token: multi-turn masks tool results out."""
    lengths = response_mask.sum(-1)
    placed = torch.zeros_like(response_mask, dtype=torch.float32)
    last = response_mask.shape[1] - 1 - response_mask.flip(-1).argmax(-1)
    placed[torch.arange(len(scores)), last] = scores.float() * (lengths > 0)
    return placed


def reward_rows(result: RewardResult) -> dict[str, list]:
    """The batch rows of a scoring: ``score``, each extra, and ``pred`` (the answers, for maj@k)."""
    rows = {k: list(v) for k, v in result.extra.items()} | {"score": result.scores.tolist()}
    if result.preds is not None:
        rows["pred"] = result.preds
    return rows


def reward_components(batch, keys: tuple[str, ...]) -> Tensor:
    """(B, K) float32: the per-sample values the reward function returned under each of ``keys``
    (its dict's extras, left in the batch's rows by ``reward_rows``), one column per key."""
    extras = [key for key in batch.rows if key not in ("score", "pred")]
    columns = []
    for key in keys:
        if key not in batch.rows:
            raise RlcoreError(f"algorithm.gdpo_reward_keys names {key!r}, but the reward function returned no such "
                              f"key; it returned: {', '.join(extras) or 'a number, not a dict'}")
        column = torch.tensor(batch[key], dtype=torch.float32)
        if column.isnan().any():
            raise RlcoreError(f"algorithm.gdpo_reward_keys: the reward function returned {key!r} for only some "
                              f"samples ({int(column.isnan().sum())} of {len(column)} lack a number there)")
        columns.append(column)
    return torch.stack(columns, dim=1)
