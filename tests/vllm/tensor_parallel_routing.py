"""The 2-rank half of test_routed_experts.py's tensor-parallel test: ``python -m
tests.vllm.tensor_parallel_routing MODEL OUT`` in two processes with torchrun's variables, one GPU
each. Both ranks form one vLLM engine with tensor parallelism 2 that returns routed experts; each
rank writes its own rows (``OUT/rank<r>.pt``), the ``routed_experts`` column among them."""

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
from rlcore.training.roles import SamplingParams
from rlcore.training.specs import rollout_spec
from rlcore_vllm.options import VllmOptions
from tests.fsdp.helpers import job

# rank 0 and rank 1 bring different prompts, and different numbers of them
QUESTIONS = {0: ["What is 3 + 4?", "2 * 5 ="], 1: ["how many apples did she buy each week"]}
LENGTH = 12


def main(model_path: str, out: str) -> None:
    platform = current_platform()
    dist.init_process_group("nccl" if platform.device_type == "cuda" else "gloo")
    rollout = {"tensor_model_parallel_size": 2, "gpu_memory_utilization": 0.2, "return_routed_experts": True}
    config = attrs.evolve(job(model_path, rollout=rollout), data=DataConfig(max_prompt_length=32, max_response_length=LENGTH),
                          sections={"rollout.vllm": VllmOptions(enforce_eager=True, engine_kwargs={"moe_backend": "triton"})})
    engine = get_manager().get("rollout_engines", "vllm")(rollout_spec(config), platform, None)
    assert engine.tp_group is not None  # one engine over both ranks
    rank = dist.get_rank()
    encoded = load_tokenizer(model_path)(QUESTIONS[rank], return_tensors="pt", padding=True)
    prompts = Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})
    rows = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=LENGTH, seed=1))
    torch.save(dict(rows.tensors), Path(out) / f"rank{rank}.pt")
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
