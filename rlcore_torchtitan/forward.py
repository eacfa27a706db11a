"""Response log-probs from torchtitan's model over rlcore's padded rows.

A batch's rows are (prompt + response) of width P + R: the prompt left-padded, the response
right-padded. torchtitan's decoder takes tokens and (optionally) positions and applies its attention
without a padding mask, so each row's real tokens are laid out from column 0 (``compact``): under plain
causal attention a real token then sees exactly the real tokens before it, at positions 0, 1, ... as
in the Hugging Face forward with its attention mask, and the padding after them changes nothing.
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor, nn

from rlcore.api import Batch, to_device, token_log_probs


@attrs.frozen
class CompactRows:
    tokens: Tensor  # (B, L) each row's real tokens from column 0, then padding (0)
    predictors: Tensor  # (B, R) the column whose logits predict each response token (0 where it has none)
    targets: Tensor  # (B, R) the response tokens
    has_token: Tensor  # (B, R) bool: the response has a token there


def compact(batch: Batch, device: torch.device) -> CompactRows:
    """The batch's rows with their real tokens moved to the front (``CompactRows``)."""
    input_ids = to_device(batch["input_ids"], device)  # (B, P + R)
    mask = to_device(batch["attention_mask"], device).bool()  # (B, P + R)
    responses = to_device(batch["responses"], device)  # (B, R)
    response_length = responses.shape[1]
    column = mask.long().cumsum(-1) - 1  # (B, P + R) where each real token goes
    width = max(int(mask.sum(-1).max()), 1)
    tokens = torch.zeros(input_ids.shape[0], width, dtype=input_ids.dtype, device=device)
    rows, slots = mask.nonzero(as_tuple=True)
    tokens[rows, column[rows, slots]] = input_ids[rows, slots]
    has_token = mask[:, -response_length:]  # (B, R)
    # the token at column c is predicted by the logits at column c - 1
    predictors = torch.where(has_token, column[:, -response_length:] - 1, 0).clamp(min=0)
    return CompactRows(tokens, predictors, responses, has_token)


def log_probs_and_entropy(model: nn.Module, batch: Batch, device: torch.device, temperature: float,
                          with_entropy: bool, *, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs (B, R) of the batch's responses at the sampling temperature and, if asked, the
    entropy (B, R; with its graph only under ``entropy_grad``); 0 where a response has no token."""
    rows = compact(batch, device)
    logits = model(rows.tokens)  # (B, L, V)
    chosen = logits.gather(1, rows.predictors.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # (B, R, V)
    log_probs, entropy = token_log_probs(chosen, rows.targets, temperature, with_entropy=with_entropy,
                                         entropy_grad=entropy_grad)
    log_probs = torch.where(rows.has_token, log_probs, 0.0)
    if entropy is not None:
        entropy = torch.where(rows.has_token, entropy, 0.0)
    return log_probs, entropy
