"""Where a response's score goes: on its last model token, the token-level reward every estimator
reads (verl's ``token_level_scores``); and the per-sample rows the scores leave in the batch."""

from __future__ import annotations

import torch
from torch import Tensor

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
