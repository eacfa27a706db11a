"""PF-PPO (policy filtration for PPO, as verl implements it: ``algorithm.use_pf_ppo``): after the
advantages, the batch is resampled with replacement, each sample drawn with a weight computed from its
score, so the update sees more of the samples whose rewards are most reliable (the highest and lowest
scored). The batch keeps its size; a sample may appear several times, another not at all."""

from __future__ import annotations

import torch


def pf_ppo_weights(scores: torch.Tensor, method: str, weight_pow: float) -> torch.Tensor:
    """Each sample's drawing weight (B,) from its score (B,): ``pow`` |score| ** weight_pow; ``max_min``
    1 for the batch's highest and lowest scores, 0 otherwise; ``max_random`` 0.4 for the highest, 0.1
    for the others. A floor of 1e-8 keeps every sample drawable, as in verl."""
    if method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif method == "max_min":
        weights = ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    elif method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(f"algorithm.pf_ppo.reweight_method = {method!r}: expected pow, max_min or max_random")
    return torch.clamp(weights + 1e-8, min=1e-8)


def pf_ppo_sample(scores: torch.Tensor, method: str, weight_pow: float, generator: torch.Generator) -> torch.Tensor:
    """The rows of the resampled batch: as many indices as samples, drawn with replacement by weight."""
    weights = pf_ppo_weights(scores.float(), method, weight_pow)
    return torch.multinomial(weights, len(weights), replacement=True, generator=generator)
