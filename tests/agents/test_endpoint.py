"""The OpenAI-compatible endpoint through real HTTP (the ``openai`` package) in front of the real ``hf``
engine on tiny models: the rows hold the engine's very tokens and log-probs, masks cover exactly the
model's tokens, concurrent episodes never mix, and what the job does not allow is refused by name."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlcore.models.loading import load_tokenizer
from rlcore.training.roles import SamplingParams
from tests.agents.conftest import ANSWER, RESPONSE_LENGTH, agent_rollout, prompt_batch

openai = pytest.importorskip("openai", reason="the agent tests drive the endpoint with the openai package")

SAMPLING = SamplingParams(n=2, temperature=1.0, max_new_tokens=RESPONSE_LENGTH, seed=7)
CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "arithmetic",
                                               "parameters": {"type": "object", "properties": {
                                                   "expression": {"type": "string"}}}}}


def run(engine, agent, questions, sampling=SAMPLING, per_call=True, **kwargs):
    rollout = agent_rollout(engine, agent, **kwargs)
    try:
        tokenizer = load_tokenizer(engine.config.model.path)
        return rollout.generate(prompt_batch(tokenizer, questions), sampling, engine.generate, "1",
                                per_call_rows=per_call), tokenizer
    finally:
        rollout.close()


def real(batch, row: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """Row ``row``'s prompt ids, response ids, loss mask and rollout log-probs, without padding."""
    width = batch["prompts"].shape[1]
    prompt = batch["prompts"][row][batch["attention_mask"][row, :width].bool()].tolist()
    keep = batch["attention_mask"][row, width:].bool()
    return (prompt, batch["responses"][row][keep].tolist(), batch["response_mask"][row][keep].tolist(),
            batch["rollout_log_probs"][row][keep].tolist())


def reference_log_probs(model_path, prompt: list[int], response: list[int]) -> list[float]:
    """Each response token's log-prob under the model at temperature 1, from a plain transformers
    forward over the whole row (independent of the engine's code)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1]  # (R, V): the logits that predict each response token
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0].tolist()


def test_an_appending_agent_gives_one_row_of_the_engines_tokens(tiny_engine):
    """Three chat calls per episode, each appending the answer and a user turn: one row per episode; the
    mask is 1 on exactly the tokens the endpoint returned, whose log-probs are the engine's (as the
    client received them, and as a plain forward of the model computes them); between them, masked,
    the user turns as ChatML writes them after an assistant turn."""
    seen: dict[str, list] = {}

    async def agent(episode, client):
        messages, calls = list(episode.prompt), []
        for turn in range(3):
            response = await client.chat.completions.create(model="any", messages=messages, logprobs=True,
                                                            max_tokens=8, temperature=1.0)
            choice = response.choices[0]
            calls.append((choice.message.content, [t.logprob for t in choice.logprobs.content],
                          response.usage.completion_tokens, choice.finish_reason))
            messages += [{"role": "assistant", "content": choice.message.content},
                         {"role": "user", "content": f"go on {turn}"}]
        seen[episode.api_key] = calls
        return "final"

    batch, tokenizer = run(tiny_engine, agent, ["What is 3 + 4?", "how many apples"])
    metrics = batch.meta["agent_metrics"]
    assert metrics["agent/episodes"] == metrics["agent/rows"] == 4 and metrics["agent/errors"] == 0, metrics
    assert metrics["agent/calls/min"] == metrics["agent/calls/max"] == 3 and metrics["agent/non_extending_episodes"] == 0
    assert batch.meta["source_rows"] == [0, 1, 2, 3] and batch["response"] == ["final"] * 4
    assert len(seen) == 4
    eos = tokenizer.eos_token_id
    for row in range(4):
        prompt, response, mask, log_probs = real(batch, row)
        # which episode: the one whose received log-probs are this row's (the keys are secret to the rows)
        generated = [lp for lp, m in zip(log_probs, mask) if m]
        calls = [c for c in seen.values() if [x for call in c for x in call[1]] == pytest.approx(generated, abs=1e-6)]
        assert len(calls) == 1, "each row's trained log-probs are exactly one episode's, as its client received them"
        # the segments: 8 generated tokens (the tiny random model never stops early), then the user turn
        position = 0
        for turn, (text, received, count, finish) in enumerate(calls[0]):
            assert count == 8 and finish == "length"
            assert mask[position:position + 8] == [1] * 8
            assert tokenizer.decode(response[position:position + 8], skip_special_tokens=True) == text
            position += 8
            if turn < 2:
                between = [eos] + tokenizer.encode(f"\n<|im_start|>user\ngo on {turn}<|im_end|>\n"
                                                   "<|im_start|>assistant\n", add_special_tokens=False)
                assert response[position:position + len(between)] == between
                assert mask[position:position + len(between)] == [0] * len(between)
                position += len(between)
        assert position == len(response)
        expected = reference_log_probs(tiny_engine.config.model.path, prompt, response)
        assert [e for e, m in zip(expected, mask) if m] == pytest.approx(generated, abs=1e-4)
        assert all(lp == 0.0 for lp, m in zip(log_probs, mask) if not m)


def test_sixteen_concurrent_episodes_never_mix(tiny_engine):
    """16 episodes, each saying its number in every call: each row holds only its own episode's turns,
    and the engine served them in far fewer calls than 32 (gathered across episodes)."""
    texts: dict[int, list[str]] = {}

    async def agent(episode, client):
        number = episode.extra_info["index"] * 2 + episode.sample
        messages, got = list(episode.prompt), []
        for turn in range(2):
            await asyncio.sleep(0.01 * (number % 4))  # episodes out of step with each other
            response = await client.chat.completions.create(model="m", messages=messages, max_tokens=4)
            got.append(response.choices[0].message.content)
            messages += [{"role": "assistant", "content": got[-1]}, {"role": "user", "content": f"episode {number}"}]
        texts[number] = got
        return got[-1]

    before = tiny_engine.engine_calls
    batch, tokenizer = run(tiny_engine, agent, [f"question {i}" for i in range(8)])
    assert len(batch) == 16 and batch.meta["agent_metrics"]["agent/non_extending_episodes"] == 0
    assert tiny_engine.engine_calls - before < 16
    for row in range(16):
        number = batch.meta["source_rows"][row]  # prompts x n, in order: episode 2i + sample
        prompt, response, mask, _ = real(batch, row)
        assert f"question {number // 2}" in tokenizer.decode(prompt)
        assert tokenizer.decode(response[4:-4], skip_special_tokens=True) == f"\nuser\nepisode {number}\nassistant\n"
        assert tokenizer.decode(response[:4], skip_special_tokens=True) == texts[number][0]
        assert tokenizer.decode(response[-4:], skip_special_tokens=True) == texts[number][1]
        assert batch["response"][row] == texts[number][1]


def test_a_history_rewriting_agent_gives_one_row_per_call(tiny_engine):
    """An agent that drops its earlier turns: its calls do not extend each other, so each call is a row
    of its own (its prompt, its output, all trained), counted in agent/non_extending_episodes; validation
    keeps one row per episode (the last call's)."""
    async def agent(episode, client):
        first = await client.chat.completions.create(model="m", messages=episode.prompt, max_tokens=5)
        summary = [{"role": "user", "content": "summary: " + first.choices[0].message.content[:3]}]
        second = await client.chat.completions.create(model="m", messages=summary, max_tokens=6)
        return second.choices[0].message.content

    batch, tokenizer = run(tiny_engine, agent, ["What is 3 + 4?"])
    metrics = batch.meta["agent_metrics"]
    assert metrics["agent/non_extending_episodes"] == 2 and metrics["agent/rows"] == 4, metrics
    assert batch.meta["source_rows"] == [0, 0, 1, 1]
    for row in range(4):
        prompt, response, mask, _ = real(batch, row)
        assert len(response) == (5 if row % 2 == 0 else 6) and mask == [1] * len(response)
        assert ("summary: " in tokenizer.decode(prompt)) == (row % 2 == 1)
    validation, _ = run(tiny_engine, agent, ["What is 3 + 4?"], per_call=False)
    assert validation.meta["source_rows"] == [0, 1] and validation.meta["agent_metrics"]["agent/non_extending_episodes"] == 2


def test_tool_calls_follow_the_family_format_and_tool_results_are_masked(tool_engine):
    """The policy that calls the calculator and answers once 12321 is in the conversation: the endpoint
    renders the tools in the system prompt (the tiny template has no tool format), parses the call into
    tool_calls, takes the tool message back, and the row trains the call and the answer only."""
    replies = []

    async def agent(episode, client):
        messages = list(episode.prompt)
        first = await client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR])
        message = first.choices[0].message
        replies.append((first.choices[0].finish_reason, message.tool_calls))
        messages.append(message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "12321"})
        second = await client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR])
        replies.append((second.choices[0].finish_reason, second.choices[0].message.content))
        return second.choices[0].message.content

    batch, tokenizer = run(tool_engine, agent, ["What is 111 * 111?"], sampling=SamplingParams(n=1, seed=3))
    finish, calls = replies[0]
    assert finish == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "calculator" and calls[0].function.arguments == '{"expression": "111*111"}'
    assert replies[1] == ("stop", ANSWER)
    assert batch["response"] == [ANSWER] and batch.meta["agent_metrics"]["agent/non_extending_episodes"] == 0
    prompt, response, mask, _ = real(batch, 0)
    assert "<tools>" in tokenizer.decode(prompt) and '"calculator"' in tokenizer.decode(prompt)
    trained = tokenizer.decode([t for t, m in zip(response, mask) if m])
    masked = tokenizer.decode([t for t, m in zip(response, mask) if not m])
    assert trained == f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "111*111"}}}}</tool_call>' \
                      f"<|im_end|>{ANSWER}<|im_end|>"
    assert masked == "\n<|im_start|>tool\n12321<|im_end|>\n<|im_start|>assistant\n"


def test_requests_for_other_settings_are_refused_naming_the_field(tiny_engine):
    """Sampling settings other than the job's, several choices, a longer response, streaming, stop
    sequences and forced tool choice: each an OpenAI-style 400 naming the field; a key that names no
    episode: 401. The job's own values, and a smaller max_tokens, are accepted."""
    refusals: dict[str, tuple] = {}
    asks = {"temperature": {"temperature": 0.5}, "top_p": {"top_p": 0.9}, "n": {"n": 2},
            "max_tokens": {"max_tokens": RESPONSE_LENGTH + 1}, "stream": {"stream": True}, "stop": {"stop": ["\n"]},
            "tool_choice": {"tools": [CALCULATOR], "tool_choice": "required"}}

    async def agent(episode, client):
        if episode.sample:
            return None
        for field, extra in asks.items():
            try:
                await client.chat.completions.create(model="m", messages=episode.prompt, **extra)
            except openai.BadRequestError as error:
                refusals[field] = (error.status_code, error.param, error.body["message"])
        stranger = openai.AsyncOpenAI(base_url=episode.base_url, api_key="no-such-episode", max_retries=0)
        try:
            await stranger.models.list()  # the model list is open to every key
            await stranger.chat.completions.create(model="m", messages=episode.prompt, max_tokens=2)
        except openai.AuthenticationError as error:
            refusals["key"] = (error.status_code, error.code)
        finally:
            await stranger.close()
        ok = await client.chat.completions.create(model="m", messages=episode.prompt, temperature=1.0, top_p=1.0,
                                                  n=1, max_tokens=3)
        refusals["accepted"] = ok.usage.completion_tokens
        return None

    batch, _ = run(tiny_engine, agent, ["What is 3 + 4?"])
    assert {field: refusals[field][:2] for field in asks} == {field: (400, field) for field in asks}
    assert "rollout.temperature" in refusals["temperature"][2] and "data.max_response_length" in refusals["max_tokens"][2]
    assert refusals["key"] == (401, "invalid_api_key") and refusals["accepted"] == 3
    assert batch.meta["agent_metrics"]["agent/refused_requests"] == len(asks)


def test_completions_extend_the_text_and_models_are_listed(tiny_engine):
    """/v1/completions: a prompt that continues the last prompt and completion reuses their tokens (one
    row); /v1/models names the policy; an agent without an OpenAI client uses the base_url and key."""
    import httpx

    listed = []

    async def agent(episode, client):
        assert client is None
        headers = {"Authorization": f"Bearer {episode.api_key}"}
        async with httpx.AsyncClient(base_url=episode.base_url, headers=headers, timeout=60) as http:
            listed.append((await http.get("/models")).json()["data"][0]["id"])
            text = "What is 3 + 4?"
            for _ in range(2):
                answer = (await http.post("/completions", json={"model": "m", "prompt": text, "max_tokens": 4})).json()
                text += answer["choices"][0]["text"] + " and then"
        return text

    batch, tokenizer = run(tiny_engine, agent, ["unused"], openai_client=False)
    assert listed == ["tiny-qwen2", "tiny-qwen2"]
    assert batch.meta["agent_metrics"]["agent/non_extending_episodes"] == 0 and len(batch) == 2
    prompt, response, mask, _ = real(batch, 0)
    assert prompt == tokenizer.encode("What is 3 + 4?")
    assert mask == [1] * 4 + [0] * len(tokenizer.encode(" and then", add_special_tokens=False)) + [1] * 4
