"""``Batch``: the rows that flow between roles: named tensors of one batch size plus per-row objects.

Tensor keys used across rlcore (B rows, P prompt tokens left-padded, R response tokens right-padded):
  prompts (B, P), responses (B, R), input_ids (B, P+R), attention_mask (B, P+R), position_ids (B, P+R),
  response_mask (B, R), old_log_probs (B, R), ref_log_prob (B, R), values (B, R), rollout_log_probs (B, R),
  token_level_scores (B, R), token_level_rewards (B, R), advantages (B, R), returns (B, R).
  routed_experts (B, P+R, L, K): a mixture of experts' chosen experts per position, MoE layer and choice
  (< 0: none recorded), from an engine (rollout.return_routed_experts) or the old log-prob pass (actor.router_replay).
Per-row keys (lists): data_source, ground_truth, extra_info, uid (the prompt's group id), raw_prompt,
score, reward_baseline (ReMax's greedy score).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from rlcore.errors import RlcoreError


class Batch:
    def __init__(self, tensors: dict[str, torch.Tensor] | None = None, rows: dict[str, list] | None = None,
                 meta: dict[str, Any] | None = None):
        self.tensors = dict(tensors or {})
        self.rows = {k: list(v) for k, v in (rows or {}).items()}
        self.meta = dict(meta or {})  # batch-wide values (e.g. sampling settings, metrics)
        sizes = {k: v.shape[0] for k, v in self.tensors.items()} | {k: len(v) for k, v in self.rows.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch columns differ in length: {sizes}")

    def __len__(self) -> int:
        for value in self.tensors.values():
            return value.shape[0]
        for value in self.rows.values():
            return len(value)
        return 0

    def __getitem__(self, key: str):
        return self.tensors[key] if key in self.tensors else self.rows[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.rows

    def update(self, other: Batch) -> Batch:
        """This batch with ``other``'s columns added (same rows, same order)."""
        if len(other) and len(self) and len(other) != len(self):
            raise ValueError(f"cannot merge a batch of {len(other)} rows into one of {len(self)}")
        return Batch(self.tensors | other.tensors, self.rows | other.rows, self.meta | other.meta)

    def select(self, index: Sequence[int] | torch.Tensor) -> Batch:
        idx = torch.as_tensor(index, dtype=torch.long)
        positions = idx.tolist()
        # index_select, not v[idx]: the same rows, faster on the host (40 of 512 x 1024 int64 rows: 13 against
        # 52 us with one thread on the GPU machine's host, benchmarks/host_waits.py copies)
        # the index copied once to each device the columns are on, not once a column
        idx_on = {device: idx.to(device) for device in {v.device for v in self.tensors.values()}}
        return Batch({k: v.index_select(0, idx_on[v.device]) for k, v in self.tensors.items()},
                     {k: [v[i] for i in positions] for k, v in self.rows.items()}, self.meta)

    def split(self, size: int) -> list[Batch]:
        return [self.select(range(start, min(start + size, len(self)))) for start in range(0, len(self), size)]

    def chunk(self, parts: int) -> list[Batch]:
        """``parts`` equal pieces; the batch must divide evenly."""
        if len(self) % parts:
            raise ValueError(f"{len(self)} rows do not divide into {parts} equal parts")
        return self.split(len(self) // parts)

    def repeat_interleave(self, times: int) -> Batch:
        """Each row ``times`` times in a row (prompt -> its n samples)."""
        order = [i for i in range(len(self)) for _ in range(times)]
        return self.select(order)

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, self.rows, self.meta)

    @staticmethod
    def concat(batches: Iterable[Batch], left_pad: dict[str, float] | None = None) -> Batch:
        """Rows of all batches in order. Tensors named in ``left_pad`` may differ in width (dim 1):
        they are padded on the left with the given value to the widest (left-padded prompts)."""
        batches = [b for b in batches]
        if not batches:
            return Batch()
        first, left_pad = batches[0], left_pad or {}

        def column(key: str) -> torch.Tensor:
            parts = [b.tensors[key] for b in batches]
            if key in left_pad:
                width = max(p.shape[1] for p in parts)
                # F.pad's pairs run from the last dimension back: (0, 0) for each one after dim 1
                parts = [torch.nn.functional.pad(p, (0, 0) * (p.dim() - 2) + (width - p.shape[1], 0),
                                                 value=left_pad[key]) for p in parts]
            return torch.cat(parts)

        return Batch({k: column(k) for k in first.tensors},
                     {k: [x for b in batches for x in b.rows[k]] for k in first.rows}, first.meta)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self.tensors.items())
        return f"Batch({len(self)} rows; {shapes}; rows: {', '.join(self.rows)})"


def mini_batch_rows(prompts_per_mini_batch: int, n: int, groups: int, section: str) -> int:
    """Rows of one mini-batch that each of ``groups`` data-parallel groups trains on: prompts x n
    samples split evenly over the groups (``section``: "actor" or "critic", for the error)."""
    samples = prompts_per_mini_batch * n
    if samples % groups:
        raise RlcoreError(f"{section}.ppo_mini_batch_size x rollout.n = {samples} samples do not split evenly "
                          f"over {groups} data-parallel ranks")
    return samples // groups
