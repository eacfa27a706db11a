"""What the model generated, as records a person can read: one per response, with its prompt, its
score and its reward details. Written per step as JSONL (``trainer.rollout_data_dir``,
``trainer.validation_data_dir``, as verl names them) and sampled for the loggers
(``trainer.log_val_generations``)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from rlcore.batch import Batch
from rlcore.runtime.atomic import publish, staging_file

# The row keys a reward function's extra values are listed under in a scored batch's meta.
REWARD_EXTRA_KEYS = "reward_extra_keys"
# Same order of samples at every validation, so the loggers show the same prompts as training goes.
SAMPLE_SEED = 42


def generation_records(batch: Batch, tokenizer, step: int) -> list[dict]:
    """One record per row of a generated and scored batch: ``input`` (the prompt as the model saw
    it, special tokens removed), ``output`` (the response), ``gts`` (the ground truth), ``score``,
    ``data_source``, ``step``, ``reward`` (the sequence's reward after any KL penalty, where
    computed), ``policy_version`` and ``policy_version_last`` (asynchronous mode: the policy versions
    it started and ended under) and the reward function's extra values."""
    width = batch["prompts"].shape[1]
    prompt_mask = batch["attention_mask"][:, :width].bool()
    inputs = tokenizer.batch_decode([ids[mask] for ids, mask in zip(batch["prompts"], prompt_mask)],
                                    skip_special_tokens=True)
    outputs = tokenizer.batch_decode([ids[mask.bool()] for ids, mask in zip(batch["responses"],
                                                                            batch["response_mask"])],
                                     skip_special_tokens=True)
    rewards = batch["token_level_rewards"].sum(-1).tolist() if "token_level_rewards" in batch else None
    extras = [key for key in batch.meta.get(REWARD_EXTRA_KEYS, ()) if key in batch]
    records = []
    for i, (text_in, text_out) in enumerate(zip(inputs, outputs)):
        record = {"step": step, "data_source": batch["data_source"][i], "input": text_in, "output": text_out,
                  "gts": batch["ground_truth"][i], "score": float(batch["score"][i])}
        if rewards is not None:
            record["reward"] = rewards[i]
        if "policy_version" in batch:  # the asynchronous mode's: the policy version that generated it
            record["policy_version"] = int(batch["policy_version"][i])
        if "policy_version_last" in batch:  # ...and the one that ended it (newer after a partial rollout)
            record["policy_version_last"] = int(batch["policy_version_last"][i])
        record |= {key: _plain(batch[key][i]) for key in extras if key not in record}
        records.append(record)
    return records


def write_generations(directory: str | Path, step: int, records: list[dict]) -> Path:
    """``<directory>/<step>.jsonl``, published whole: a crash while writing leaves no partial file."""
    final = Path(directory) / f"{step}.jsonl"
    staged = staging_file(final)
    try:
        with staged.open("w", encoding="utf-8") as file:
            for record in records:
                file.write(json.dumps(record, ensure_ascii=False) + "\n")
        publish(staged, final)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return final


def sample_generations(records: list[dict], count: int) -> list[dict]:
    """``count`` records, the same prompts at every call for the same data: sorted by input, then
    shuffled with a fixed seed (verl's choice)."""
    chosen = sorted(records, key=lambda r: (r["input"], r["output"]))
    random.Random(SAMPLE_SEED).shuffle(chosen)
    return chosen[:count]


def _plain(value):
    """A JSON-ready value: tensors and numpy scalars become Python numbers, anything else its text."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None  # a reward function's extra value absent for this sample
    if value is None or isinstance(value, (bool, int, float, str, list, dict)):
        return value
    return str(value)
