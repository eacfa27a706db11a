"""The 2-rank half of test_tensor_parallel.py: ``python -m tests.vllm.tensor_parallel MODEL OUT`` in two
processes with torchrun's variables, on the CPU (gloo). Both ranks form one vLLM engine with tensor
parallelism 2 next to a 2-rank fsdp actor, as two hybrid workers would.

Each rank writes ``OUT/rank<r>.pt``: its prompts, its greedy responses before and after an actor
update and weight sync, and (rank 0) the actor's full weights after the update.
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
import torch
import torch.distributed as dist

from rlcore.batch import Batch
from rlcore.config.schema import DataConfig
from rlcore.models.loading import load_tokenizer
from rlcore.plugins.manager import get_manager
from rlcore.runtime.platforms import current_platform
from rlcore.testing import build_actor
from rlcore.training.roles import SamplingParams
from rlcore.training.specs import rollout_spec
from rlcore_vllm.options import VllmOptions
from tests.fsdp.helpers import full_weights, job

# rank 0 and rank 1 bring different prompts, and different numbers of them
QUESTIONS = {0: ["What is 3 + 4?", "2 * 5 ="], 1: ["how many apples did she buy each week"]}
LENGTH = 12
GREEDY = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=LENGTH)


def main(model_path: str, out: str) -> None:
    torch.set_num_threads(1)
    platform = current_platform()
    config = attrs.evolve(job(model_path, lr=0.05, rollout={"tensor_model_parallel_size": 2, "gpu_memory_utilization": 0.2}),
                          data=DataConfig(max_prompt_length=32, max_response_length=LENGTH),
                          sections={"rollout.vllm": VllmOptions(enforce_eager=True)})
    actor = build_actor(get_manager().get("training_backends", "fsdp"), config, platform)
    rank = dist.get_rank()
    engine = get_manager().get("rollout_engines", "vllm")(rollout_spec(config), platform, actor)
    assert engine.tp_group is not None  # one engine over both ranks

    encoded = load_tokenizer(model_path)(QUESTIONS[rank], return_tensors="pt", padding=True)
    prompts = Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})
    before = engine.generate(prompts, GREEDY)["responses"]

    # the update takes 2 samples of each rank's first prompt: equal shares, as the trainer hands out
    batch = engine.generate(prompts.select([0]), SamplingParams(n=2, temperature=1.0, max_new_tokens=LENGTH, seed=1))
    advantages = torch.tensor([1.0, -1.0]).unsqueeze(-1).expand(-1, LENGTH).contiguous()
    for _ in range(3):
        actor.update(batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": advantages})))
    engine.update_weights(actor.weights_for_rollout(2**20))
    after = engine.generate(prompts, GREEDY)["responses"]
    weights = full_weights(actor)  # every rank takes part in the gather
    result = {"input_ids": prompts["input_ids"], "attention_mask": prompts["attention_mask"], "before": before,
              "after": after, "weights": weights if rank == 0 else None}
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
