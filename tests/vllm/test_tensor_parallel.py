"""Tensor parallelism 2 over two ranks (``tests/vllm/tensor_parallel.py``): the ranks pool their prompts
into one vLLM engine, each gets back its own rows, greedy tokens equal transformers' before and after
an actor update and weight sync (each rank loads its shard of the full tensors)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlcore.models.loading import load_tokenizer
from tests.ranks import run_ranks
from tests.vllm.conftest import VLLM_MISSING

pytest.importorskip("vllm", reason=VLLM_MISSING)
if torch.cuda.is_available() and torch.cuda.device_count() < 2:
    pytest.skip("tensor parallel 2 on CUDA needs 2 GPUs (NCCL refuses two ranks on one device)",
                allow_module_level=True)


def run_two_ranks(model: Path, out: Path) -> list[dict]:
    # on GPUs each rank gets a device of its own, as the hybrid workers do under Ray
    run_ranks("tests.vllm.tensor_parallel", str(model), str(out), timeout=300, one_gpu_each=torch.cuda.is_available())
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def transformers_greedy(model_path: Path, result: dict, weights=None) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    if weights is not None:
        model.load_state_dict(weights, strict=False)  # lm_head is tied to the embedding
    output = model.generate(input_ids=result["input_ids"], attention_mask=result["attention_mask"], do_sample=False,
                            max_new_tokens=result["before"].shape[1], pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id)
    return output[:, result["input_ids"].shape[1]:]


def assert_greedy_matches(responses: torch.Tensor, expected: torch.Tensor, pad_id: int) -> None:
    width = expected.shape[1]
    assert torch.equal(responses[:, :width], expected)
    assert torch.all(responses[:, width:] == pad_id)


@pytest.mark.slow
def test_two_ranks_share_one_engine_and_each_gets_its_rows(engine_model, tmp_path):
    results = run_two_ranks(engine_model, tmp_path)
    pad = load_tokenizer(str(engine_model)).pad_token_id
    weights = results[0]["weights"]
    changed = False
    for result in results:
        assert_greedy_matches(result["before"], transformers_greedy(engine_model, result), pad)
        expected = transformers_greedy(engine_model, result, weights)
        assert_greedy_matches(result["after"], expected, pad)
        changed |= not torch.equal(result["after"], result["before"])
    assert changed  # the update changed what greedy decoding says
