"""The 2-rank half of test_generation_groups.py: ``python -m tests.rollout.group_ranks MODEL OUT`` in
two processes with torchrun's variables, on the CPU (gloo). Each rank holds the whole tiny model (as
Megatron's tensor-parallel ranks hold a Hugging Face copy each) and generates its share of the prompts:
once as one generation group (the world), once alone. Each writes ``OUT/rank<r>.pt``."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore.batch import Batch
from rlcore.models.loading import load_tokenizer
from rlcore.runtime.platforms import current_platform
from rlcore.training.roles import Actor, SamplingParams
from rlcore.training.specs import rollout_spec
from tests.fsdp.helpers import job

QUESTIONS = ["What is 3 + 4?", "how many apples did she buy each week and how many were left", "2 * 5 =",
             "she sold half", "What is the total cost of the books she bought per week?"]
SHARES = [range(0, 3), range(3, 5)]  # uneven, and rank 1's rows are narrower than rank 0's
SAMPLING = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=11)


class WholeModelActor(Actor):
    """Lends a whole Hugging Face model; ``group`` is the generation group it reports."""

    compute_log_prob = update = weights_for_rollout = save = load = None  # the engine calls none of them

    def __init__(self, model_path, group):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.group = group

    @contextmanager
    def _lend(self):
        with torch.no_grad():
            yield self.model

    def generation_module(self):
        return self._lend()

    def generation_group(self):
        return self.group


def prompts(model_path, rows) -> Batch:
    """Rows ``rows`` of the prompts, left-padded to their own longest (as a share arrives)."""
    tokenizer = load_tokenizer(str(model_path))
    encoded = tokenizer([QUESTIONS[i] for i in rows], return_tensors="pt", padding=True)
    return Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


def generate(model_path, rows, group) -> Batch:
    from rlcore.rollout.hf import HfRollout

    config = job(model_path)
    engine = HfRollout(rollout_spec(config), current_platform(), WholeModelActor(model_path, group))
    return engine.generate(prompts(model_path, rows), SAMPLING)


def main(model_path: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    together = generate(model_path, SHARES[rank], dist.group.WORLD)
    alone = generate(model_path, SHARES[rank], None)
    torch.save({"together": together.tensors, "alone": alone.tensors}, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
