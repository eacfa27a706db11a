"""Prompt rows in, response rows out: what every rollout engine that returns token lists shares.

Inference engines take unpadded prompts and return each response as a list of token
ids (and log-probs); the controller wants the ``hf`` engine's padded rows. These helpers convert
between the two, so that every engine hands back the same tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlcore.batch import Batch
from rlcore.errors import RlcoreError

# Batch meta key: seconds an engine spent in each phase of one generate call (rank 0's), which the
# controller reports as ``timing_s/gen/<phase>``.
ROLLOUT_TIMING = "rollout_timing"


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


def group_leader(group) -> int:
    """The global rank that stands for a generation group (its lowest); this rank's own when it
    generates alone (0 outside ``torch.distributed``)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return 0
    if group is None:
        return dist.get_rank()
    return min(dist.get_process_group_ranks(group))


def pool_rows(group, ids: Tensor, mask: Tensor, pad_id: int) -> tuple[Tensor, Tensor, slice]:
    """The left-padded prompt rows of every rank of ``group`` (in group-rank order, padded to one
    width) and where this rank's own rows are among them; the rows unchanged without a group."""
    if group is None:
        return ids, mask, slice(0, ids.shape[0])
    import torch.distributed as dist

    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, (ids.cpu(), mask.cpu()), group=group)
    width = max(part[0].shape[1] for part in parts)

    def left_pad(t: Tensor, value: int) -> Tensor:
        return torch.cat([t.new_full((t.shape[0], width - t.shape[1]), value), t], dim=1)

    start = sum(part[0].shape[0] for part in parts[:dist.get_rank(group)])
    return (torch.cat([left_pad(i, pad_id) for i, _ in parts]), torch.cat([left_pad(m, 0) for _, m in parts]),
            slice(start, start + ids.shape[0]))


def pool_objects(group, values: list) -> list:
    """``values`` (one per prompt row) of every rank of ``group``, in group-rank order, as ``pool_rows`` lays
    the rows out; ``values`` unchanged without a group."""
    if group is None:
        return values
    import torch.distributed as dist

    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, values, group=group)
    return [value for part in parts for value in part]


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
