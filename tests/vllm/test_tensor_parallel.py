"""Tensor parallelism 2 over two ranks (``tests/vllm/tensor_parallel.py``): the ranks pool their prompts
into one vLLM engine, each gets back its own rows, greedy tokens equal transformers' before and after
an actor update and weight sync (each rank loads its shard of the full tensors)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcore.models import load_tokenizer
from tests.vllm.conftest import VLLM_MISSING

pytest.importorskip("vllm", reason=VLLM_MISSING)

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(model: Path, out: Path) -> list[dict]:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "RLCORE_PLATFORM": "cpu",
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.vllm.tensor_parallel", str(model), str(out)],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("the 2-rank run did not finish in 300 s")
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{logs[rank][-4000:]}"
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
