"""ReMax's baseline (``algorithm.adv_estimator = "remax"``): the score of one greedy response per
prompt. Here, the prompts to ask it for; the controller generates and scores them."""

from __future__ import annotations

from rlcore.batch import Batch

# the per-row data that belongs to a prompt (and so to each of its samples)
PROMPT_ROWS = ("data_source", "ground_truth", "extra_info", "raw_prompt", "uid")


def baseline_prompts(batch: Batch, n: int) -> Batch:
    """One row per prompt of a batch as generated (each prompt's ``n`` samples in a row): its prompt
    tokens and its prompt rows, ready to generate from again."""
    first = batch.select(range(0, len(batch), n))
    width = first["prompts"].shape[1]
    return Batch({"input_ids": first["prompts"], "attention_mask": first["attention_mask"][:, :width],
                  "position_ids": first["position_ids"][:, :width]},
                 {k: v for k, v in first.rows.items() if k in PROMPT_ROWS})
