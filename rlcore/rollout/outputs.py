"""Prompt rows in, response rows out: what every rollout engine that returns token lists shares.

Engines such as vLLM and SGLang take unpadded prompts and return each response as a list of token
ids (and log-probs); the controller wants the ``hf`` engine's padded rows. These helpers convert
between the two, so that every engine hands back the same tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlcore.batch import Batch
from rlcore.errors import RlcoreError


def prompt_tensors(prompts: Batch, pad_id: int, engine: str) -> tuple[Tensor, Tensor]:
    """Left-padded ``input_ids`` (B, P) and ``attention_mask`` (B, P); a batch with only ``prompts``
    is read as left-padded with ``pad_id`` (the leading run of pads; pad may equal eos mid-prompt)."""
    if "input_ids" in prompts:
        ids = prompts["input_ids"]
        mask = prompts["attention_mask"] if "attention_mask" in prompts else None
    elif "prompts" in prompts:
        ids, mask = prompts["prompts"], None
    else:
        raise RlcoreError(f"the {engine} engine needs prompt rows 'input_ids' (and 'attention_mask') or "
                          f"'prompts'; got {', '.join(prompts.tensors) or 'none'}")
    if mask is None:
        mask = (ids != pad_id).long().cummax(dim=-1).values
    return ids, mask.long()


def unpadded(ids: Tensor, mask: Tensor) -> list[list[int]]:
    """Each row's tokens where ``mask`` is 1, as plain lists (what engines take)."""
    return [row[keep.bool()].tolist() for row, keep in zip(ids, mask)]


def response_rows(prompt_ids: Tensor, prompt_mask: Tensor, responses: Sequence[Sequence[int]],
                  log_probs: Sequence[Sequence[float]] | None, length: int, pad_id: int) -> Batch:
    """The rollout rows for ``responses`` (one token list per prompt row, as the engine stopped it).

    Responses are cut to ``length`` and right-padded with ``pad_id``; ``response_mask`` is 1 on the
    tokens the engine returned (through its eos or stop token). ``rollout_log_probs`` (B, R) is added
    when ``log_probs`` is given, 0 on padding.
    """
    rows = len(responses)
    if rows != prompt_ids.shape[0]:
        raise ValueError(f"{rows} responses for {prompt_ids.shape[0]} prompt rows")
    tokens = torch.full((rows, length), pad_id, dtype=prompt_ids.dtype)  # (B, R)
    response_mask = torch.zeros(rows, length, dtype=torch.long)  # (B, R)
    for row, ids in enumerate(responses):
        ids = list(ids)[:length]
        tokens[row, :len(ids)] = torch.tensor(ids, dtype=prompt_ids.dtype)
        response_mask[row, :len(ids)] = 1
    prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
    steps = torch.arange(1, length + 1, dtype=prompt_positions.dtype)
    response_positions = prompt_positions[:, -1:] + steps  # (B, R)
    out = {
        "prompts": prompt_ids,
        "responses": tokens,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, tokens], dim=1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "position_ids": torch.cat([prompt_positions, response_positions], dim=1),
    }
    if log_probs is not None:
        values = torch.zeros(rows, length, dtype=torch.float32)  # (B, R)
        for row, lps in enumerate(log_probs):
            lps = list(lps)[:length]
            values[row, :len(lps)] = torch.tensor(lps, dtype=torch.float32)
        out["rollout_log_probs"] = values * response_mask
    return Batch(out)


def eos_token_ids(model_path: str, tokenizer) -> list[int]:
    """The ids that end a response: the model's ``generation_config.json`` eos ids and the tokenizer's
    (as the ``hf`` engine stops)."""
    from transformers import GenerationConfig

    try:
        configured = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        configured = None
    configured = configured if isinstance(configured, list) else [configured]
    return sorted({i for i in (*configured, tokenizer.eos_token_id) if i is not None})
