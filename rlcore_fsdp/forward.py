"""Forward passes over (prompt + response) rows: response log-probs, entropy, values.

Only the response slice of the logits is computed (``logits_to_keep``) and turned into fp32, one
micro-batch at a time, so at most one micro-batch's (rows, R, vocab) logits exist at once.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn

from rlcore.algorithms.entropy import entropy_from_logits
from rlcore.batch import Batch

ENTROPY_CHUNK_ROWS = 2048  # rows of the (tokens, vocab) logits turned into fp32 at a time


def _model_inputs(batch: Batch, device: torch.device) -> dict[str, Tensor]:
    return {key: batch[key].to(device) for key in ("input_ids", "attention_mask", "position_ids")}


def _keeps_logits(model: nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def response_logits(model: nn.Module, batch: Batch, device: torch.device, temperature: float) -> Tensor:
    """(B, R, V) fp32 logits that predict each response token, divided by the sampling temperature
    (the distribution the tokens were drawn from, as verl)."""
    response_length = batch["responses"].shape[1]
    inputs = _model_inputs(batch, device)
    if _keeps_logits(model):
        logits = model(**inputs, use_cache=False, logits_to_keep=response_length + 1).logits
    else:
        logits = model(**inputs, use_cache=False).logits[:, -response_length - 1:]
    # position t predicts token t + 1: the last R + 1 positions' first R predict the R responses
    logits = logits[:, :-1].float()
    return logits / temperature if temperature != 1.0 else logits


def log_probs_and_entropy(model: nn.Module, batch: Batch, device: torch.device, temperature: float,
                          with_entropy: bool, *, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs (B, R) of the batch's responses and, if asked, the entropy (B, R); the
    entropy keeps its graph only with ``entropy_grad`` (an entropy bonus), else it is a metric."""
    logits = response_logits(model, batch, device, temperature)  # (B, R, V)
    responses = batch["responses"].to(device)  # (B, R)
    log_probs = logits.gather(-1, responses.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach(), chunk_size=ENTROPY_CHUNK_ROWS)
    return log_probs, entropy


def response_values(model: nn.Module, batch: Batch, device: torch.device) -> Tensor:
    """Value-head outputs (B, R) fp32 for the state before each response token (as verl)."""
    response_length = batch["responses"].shape[1]
    values = model(**_model_inputs(batch, device), use_cache=False).logits  # (B, P + R, 1)
    return values[:, -response_length - 1:-1, 0].float()


def sampling_temperature(temperature: float) -> float:
    """The temperature log-probs are computed at; greedy (0) means the plain distribution."""
    return temperature if temperature > 0 else 1.0
