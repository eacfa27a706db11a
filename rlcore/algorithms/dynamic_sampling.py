"""DAPO's dynamic sampling (``algorithm.filter_groups``): draw batches until enough prompts have
samples that differ in the chosen metric, keeping only those prompts' samples."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlcore.algorithms.dapo import filter_groups
from rlcore.algorithms.groups import group_ids_of
from rlcore.batch import Batch
from rlcore.errors import RlcoreError


def informative_batch(draw: Callable[[int], Batch], prompts: int, n: int, filtering,
                      pad_token_id: int) -> tuple[Batch, dict[str, float]]:
    """``prompts`` x ``n`` samples from groups whose ``filtering.metric`` varies; ``draw(attempt)``
    generates and scores one more batch. Batches' prompt widths differ: they are left-padded to one."""
    kept: list[Batch] = []
    wanted, generated = prompts * n, 0
    while sum(len(b) for b in kept) < wanted:
        if filtering.max_num_gen_batches and generated >= filtering.max_num_gen_batches:
            raise RlcoreError(
                f"dynamic sampling generated {generated} batches (algorithm.filter_groups.max_num_gen_batches) "
                f"without {prompts} prompts whose samples differ; the data may be too hard or too easy for "
                "the model")
        batch = draw(generated)
        generated += 1
        if filtering.metric not in batch:
            raise RlcoreError(f"algorithm.filter_groups.metric = {filtering.metric!r} is not a per-sample value "
                              "of this job's reward (use 'score', or a key the reward function returns)")
        keep = filter_groups(group_ids_of(batch["uid"]), torch.as_tensor(batch[filtering.metric],
                                                                          dtype=torch.float32))
        kept.append(batch.select(torch.nonzero(keep).flatten()))
    widths = {"prompts": pad_token_id, "input_ids": pad_token_id, "attention_mask": 0, "position_ids": 0,
              "routed_experts": -1}  # an engine's (B, P+R, L, K) choices (R3): none recorded at a pad
    return Batch.concat(kept, left_pad=widths).select(range(wanted)), {"train/num_gen_batches": generated}
