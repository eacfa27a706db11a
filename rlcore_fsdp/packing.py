"""Sequence packing (verl's ``use_remove_padding``): a padded micro-batch becomes one row of real tokens.

Rows arrive as the rollout makes them: prompt left-padded to P, response right-padded to R, the
``attention_mask`` marking real tokens. Packing keeps only real tokens, back to back, each sample
with its own ``position_ids`` (from 0) and its boundaries in ``cu_seqlens``, which the
``rlcore_packed`` attention uses to keep samples apart. Outputs come back as (B, R), zero where the
response has no token.
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from rlcore.api import Batch, to_device


@attrs.frozen
class PackedRows:
    input_ids: Tensor  # (1, T) the real tokens of all rows, row after row
    position_ids: Tensor  # (1, T) each sample's own positions
    cu_seqlens: Tensor  # (B + 1,) int32, where each sample starts in the row, then T
    max_length: int  # the longest sample
    predictors: Tensor  # (N,) packed positions whose next token is a real response token
    targets: Tensor  # (N,) those response tokens
    response_shape: tuple[int, int]  # (B, R): the rows and response columns of the unpacked output
    response_index: Tensor  # (N,) where in the (B * R) output the N values go, in order

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    def model_inputs(self) -> dict:
        """Keyword arguments for a transformers forward over the packed row. The attention mask is a
        (1, 1, 1, 1) placeholder that transformers takes as already built (a 4-D mask passes through
        ``create_causal_mask`` untouched, in every model family), so it builds no (T, T) mask from the
        packed position ids; the packed attention reads ``cu_seq_lens_q`` instead and never the mask.
        (A ``{layer type: None}`` dict did the same for Qwen2 but fails in Llama, whose forward
        always calls ``create_causal_mask``.)"""
        return {
            "input_ids": self.input_ids, "position_ids": self.position_ids,
            "attention_mask": torch.ones(1, 1, 1, 1, dtype=torch.bool, device=self.input_ids.device),
            "cu_seq_lens_q": self.cu_seqlens, "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_length, "max_length_k": self.max_length,
        }

    def unpack(self, values: Tensor) -> Tensor:
        """(N, ...) values at the response tokens -> (B, R, ...), zero elsewhere. Placed by index, not by
        mask: the gradient of a ``masked_scatter`` is a ``masked_select``, whose size the host must read
        from the device (a wait in every backward)."""
        rows, width = self.response_shape
        out = values.new_zeros((rows * width, *values.shape[1:]))
        return out.index_copy(0, self.response_index, values).view(rows, width, *values.shape[1:])

    def at_responses(self, values: Tensor) -> Tensor:
        """(B, R, ...) -> (N, ...): the values at the response tokens (``unpack``'s inverse), by index."""
        return values.flatten(0, 1).index_select(0, self.response_index)


def pack(batch: Batch, device: torch.device) -> PackedRows:
    """The micro-batch's real tokens as one packed row on ``device``. The layout is worked out where the
    batch is (the host): a boolean index or a ``max`` of device tensors would make the host wait for the
    device, several times a micro-batch; only the results travel (``to_device``)."""
    attention_mask = batch["attention_mask"].bool()  # (B, L)
    rows, width = attention_mask.shape
    response_length = batch["responses"].shape[1]
    lengths = attention_mask.sum(-1)  # (B,)
    cu_seqlens = torch.zeros(rows + 1, dtype=torch.int32, device=attention_mask.device)
    cu_seqlens[1:] = lengths.cumsum(0)
    # where each (row, column) token lands in the packed row (meaningful only for real tokens)
    packed_index = attention_mask.flatten().cumsum(0).view(rows, width) - 1  # (B, L)
    response_slots = attention_mask[:, -response_length:]  # (B, R)
    # a response token at column c is predicted by the token at column c - 1
    predictors = packed_index[:, width - response_length - 1:-1][response_slots]  # (N,)
    targets = batch["responses"][response_slots]  # (N,)
    return PackedRows(
        input_ids=to_device(batch["input_ids"][attention_mask].unsqueeze(0), device),
        position_ids=to_device(batch["position_ids"][attention_mask].unsqueeze(0), device),
        cu_seqlens=to_device(cu_seqlens, device), max_length=int(lengths.max()),
        predictors=to_device(predictors, device), targets=to_device(targets, device),
        response_shape=(rows, response_length),
        response_index=to_device(response_slots.flatten().nonzero().squeeze(-1), device),
    )
