"""``rollout.vllm.log_prob_source = "sampler"``: the sampled tokens' log-probs recorded at the engine's
sampler. Here the recording's own logic against stand-ins of vLLM's two model runners (no vLLM needed): rows
vLLM discards, a request that ran one step past its output, greedy rows, the match by prompt and tokens.
The real engine's log-probs against vLLM's own are in tests/vllm/test_engine.py."""

from __future__ import annotations

import re
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlcore.api import RlcoreError
from rlcore_vllm.sampler_log_probs import (FirstRunnerRows, RecordingSampler, RunnerV2Rows, SamplerLogProbs,
                                          chosen_log_probs, install, log_prob_recorder, recorded_log_probs)

VOCAB = 11


class Runner:
    """What the recording reads of vLLM's model runner."""

    def __init__(self, prompts: dict[str, list[int]]):
        self.requests = {rid: SimpleNamespace(prompt_token_ids=ids) for rid, ids in prompts.items()}
        self.input_batch = SimpleNamespace(req_ids=[])
        self.discard_request_mask = SimpleNamespace(np=np.zeros(8, dtype=bool))


def inner_sampler(logits, sampling_metadata):
    """vLLM's sampler as far as the recording sees it: it scales fp32 logits in place (greedy rows at 1),
    then picks."""
    temperature = sampling_metadata.temperature
    logits.div_(torch.where(temperature < 1e-5, torch.ones_like(temperature), temperature).unsqueeze(1))
    return SimpleNamespace(sampled_token_ids=logits.argmax(-1, keepdim=True).to(torch.int32))


def step(sampler, runner, request_ids, discarded, logits, temperature):
    runner.input_batch.req_ids = list(request_ids)
    runner.discard_request_mask.np[:len(request_ids)] = discarded
    metadata = SimpleNamespace(temperature=torch.tensor(temperature))
    return sampler(logits=logits.clone(), sampling_metadata=metadata)


def expected(logits, temperature):
    t = torch.tensor(temperature).unsqueeze(1)
    t = torch.where(t < 1e-5, torch.ones_like(t), t)
    log_probs = torch.log_softmax(logits / t, -1)
    return log_probs.gather(1, (logits / t).argmax(-1, keepdim=True)).squeeze(1)


def test_the_recording_keeps_the_kept_rows_per_request_and_matches_outputs_by_prompt_and_tokens():
    torch.manual_seed(0)
    prompts = {"a-1": [1, 2], "b-1": [3], "0_c-1": [4, 5], "1_c-1": [4, 5]}
    runner = Runner(prompts)
    sampler = RecordingSampler(inner_sampler, FirstRunnerRows(runner), with_temperature=True)
    sampler.start()
    steps = [(["a-1", "b-1"], [False, True], [0.7, 0.7]),  # b's prompt only partly computed: its row is discarded
             (["a-1", "b-1", "0_c-1", "1_c-1"], [False] * 4, [0.7, 0.7, 1.0, 0.0]),  # 1_c-1 greedy
             (["a-1", "b-1", "0_c-1", "1_c-1"], [False] * 4, [0.7, 0.7, 1.0, 0.0])]
    kept: dict[str, list[tuple[int, float]]] = {rid: [] for rid in prompts}
    for request_ids, discarded, temperature in steps:
        logits = torch.randn(len(request_ids), VOCAB)
        tokens = step(sampler, runner, request_ids, discarded, logits, temperature).sampled_token_ids[:, 0]
        values = expected(logits, temperature)
        for row, rid in enumerate(request_ids):
            if not discarded[row]:
                kept[rid].append((int(tokens[row]), float(values[row])))
    recorded = sampler.collect()
    assert not sampler.recording and sampler.steps == []

    # a's output stopped one token before its last recorded step (asynchronous scheduling ran one ahead)
    a_ids = [token for token, _ in kept["a-1"]][:2]
    assert recorded_log_probs(recorded, [1, 2], a_ids, 0) == pytest.approx([v for _, v in kept["a-1"][:2]], abs=1e-6)
    b_ids = [token for token, _ in kept["b-1"]]
    assert len(b_ids) == 2  # the discarded row is not one of b's tokens
    assert recorded_log_probs(recorded, [3], b_ids, 1) == pytest.approx([v for _, v in kept["b-1"]], abs=1e-6)
    for row, rid in enumerate(["0_c-1", "1_c-1"]):  # two samples of one prompt, found by their tokens
        ids = [token for token, _ in kept[rid]]
        assert recorded_log_probs(recorded, [4, 5], ids, 2 + row) == pytest.approx([v for _, v in kept[rid]],
                                                                                    abs=1e-6)
    assert recorded[(4, 5)] == []  # each recording is taken once
    with pytest.raises(RuntimeError, match="sample 4: the log-probs recorded at vLLM's sampler do not follow"):
        recorded_log_probs(recorded, [4, 5], [0, 0], 4)


def test_nothing_is_recorded_outside_a_call_and_the_sampler_passes_through():
    runner = Runner({"a-1": [1]})
    sampler = RecordingSampler(inner_sampler, FirstRunnerRows(runner), with_temperature=True)
    out = step(sampler, runner, ["a-1"], [False], torch.randn(1, VOCAB), [1.0])
    assert out.sampled_token_ids.shape == (1, 1) and sampler.steps == []
    sampler.start()
    assert sampler.collect() == {}


def test_chosen_log_probs_in_chunks_equal_a_whole_log_softmax(monkeypatch):
    import rlcore_vllm.sampler_log_probs as module

    monkeypatch.setattr(module, "ROWS_AT_ONCE", 3)
    logits = torch.randn(10, VOCAB, dtype=torch.bfloat16)
    tokens = torch.randint(0, VOCAB, (10,))
    temperature = torch.tensor([0.5, 1.0, 0.0, 2.0, 0.7, 1.0, 1.0, 0.3, 0.0, 1.5])
    scale = torch.where(temperature < 1e-5, torch.ones_like(temperature), temperature).unsqueeze(1)
    whole = torch.log_softmax(logits.float() / scale, -1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(chosen_log_probs(logits, tokens, temperature), whole, atol=1e-6, rtol=0)
    raw = torch.log_softmax(logits.float(), -1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(chosen_log_probs(logits, tokens, None), raw, atol=1e-6, rtol=0)


class RunnerV2:
    """What the recording reads of vLLM's model runner V2: a sampler called with the step's input batch,
    whose temperature is per request index, and the requests' prompts as ``add_requests`` receives them."""

    def __init__(self):
        self.req_states = SimpleNamespace(req_id_to_index={})
        self.sampler = SamplerV2()
        self.added: list[str] = []

    def add_requests(self, scheduler_output):
        for new in scheduler_output.scheduled_new_reqs:
            self.req_states.req_id_to_index[new.req_id] = len(self.req_states.req_id_to_index)
            self.added.append(new.req_id)


class SamplerV2:
    """vLLM's V2 sampler as far as the recording sees it: fp32 logits copied, then scaled (greedy rows at 1);
    ``num_sampled`` 0 on a row whose prompt is not yet fully computed."""

    def __init__(self):
        self.sampling_states = SimpleNamespace(temperature=SimpleNamespace(gpu=torch.zeros(8)))
        self.prefilling: set[str] = set()

    def __call__(self, logits, input_batch):
        temperature = self.sampling_states.temperature.gpu[input_batch.expanded_idx_mapping]
        scale = torch.where(temperature < 1e-5, torch.ones_like(temperature), temperature)
        scaled = logits.float() / scale.unsqueeze(1)
        num_sampled = torch.tensor([0 if rid in self.prefilling else 1 for rid in input_batch.req_ids])
        return SimpleNamespace(sampled_token_ids=scaled.argmax(-1, keepdim=True), num_sampled=num_sampled)


def test_model_runner_v2_rows_temperature_per_request_index_and_prompts_as_added():
    torch.manual_seed(0)
    runner = RunnerV2()
    worker = SimpleNamespace(model_runner=runner)
    assert install(worker, True) and isinstance(runner.sampler, RecordingSampler)
    assert isinstance(runner.sampler.layout, RunnerV2Rows)
    assert install(worker, True) and isinstance(runner.sampler.inner, SamplerV2)  # installed once
    sampler = runner.sampler
    prompts = {"x-1": [9], "a-1": [1, 2], "b-1": [3], "0_c-1": [4, 5], "1_c-1": [4, 5]}
    temperatures = {"x-1": 1.0, "a-1": 0.7, "b-1": 0.7, "0_c-1": 1.0, "1_c-1": 0.0}

    def add(*request_ids):
        runner.add_requests(SimpleNamespace(scheduled_new_reqs=[
            SimpleNamespace(req_id=rid, prompt_token_ids=prompts[rid]) for rid in request_ids]))
        for rid in request_ids:
            sampler.sampling_states.temperature.gpu[runner.req_states.req_id_to_index[rid]] = temperatures[rid]

    add("x-1")  # before the call: its prompt is not kept
    assert sampler.layout.new_prompts == {}
    sampler.start()
    kept: dict[str, list[tuple[int, float]]] = {rid: [] for rid in prompts}
    everyone = ["a-1", "b-1", "0_c-1", "1_c-1"]
    steps = [(["a-1", "b-1"], {"b-1"}), (everyone, set()), (everyone, set())]  # b's prompt: two chunks
    for number, (request_ids, prefilling) in enumerate(steps):
        add(*[rid for rid in request_ids if rid not in runner.req_states.req_id_to_index])
        sampler.inner.prefilling = prefilling
        index = torch.tensor([runner.req_states.req_id_to_index[rid] for rid in request_ids])
        logits = torch.randn(len(request_ids), VOCAB)
        batch = SimpleNamespace(req_ids=list(request_ids), expanded_idx_mapping=index)
        tokens = sampler(logits, batch).sampled_token_ids[:, 0]
        values = expected(logits, [temperatures[rid] for rid in request_ids])
        for row, rid in enumerate(request_ids):
            if rid not in prefilling:
                kept[rid].append((int(tokens[row]), float(values[row])))
    recorded = sampler.collect()
    assert not runner.sampler.layout.recording and runner.sampler.layout.new_prompts == {}
    for row, (rid, prompt) in enumerate([("a-1", [1, 2]), ("b-1", [3]), ("0_c-1", [4, 5]), ("1_c-1", [4, 5])]):
        ids = [token for token, _ in kept[rid]]
        assert len(ids) == (3 if rid == "a-1" else 2)  # b's first row was discarded; c came at the second step
        assert recorded_log_probs(recorded, prompt, ids, row) == pytest.approx([v for _, v in kept[rid]], abs=1e-6)
    assert set(recorded) == {(1, 2), (3,), (4, 5)}


def test_a_runner_with_neither_layout_is_not_recorded():
    assert not install(SimpleNamespace(model_runner=SimpleNamespace(sampler=object())), True)
    assert not install(SimpleNamespace(), True)
    runner = RunnerV2()
    runner.sampler = None  # model runner V2 before its sampler is built
    assert not install(SimpleNamespace(model_runner=runner), True)


def test_a_request_not_added_while_recording_is_an_error_naming_it():
    runner = RunnerV2()
    install(SimpleNamespace(model_runner=runner), True)
    runner.sampler.start()
    batch = SimpleNamespace(req_ids=["z-1"], expanded_idx_mapping=torch.tensor([0]))
    with pytest.raises(RlcoreError, match="internal: request z-1 reached vLLM's sampler while recording, but was not "
                                          "added while recording"):
        runner.sampler(torch.randn(1, VOCAB), batch)


class Engine:
    """What the choice of ``log_prob_source`` reads of ``vllm.LLM``: its one worker, through collective_rpc."""

    def __init__(self, runner):
        self.worker = SimpleNamespace(model_runner=runner)

    def collective_rpc(self, method, args=()):
        return [method(self.worker, *args)]


def test_auto_takes_log_probs_at_the_sampler_where_the_runner_allows_it_and_says_so():
    runner = Runner({})
    runner.sampler = inner_sampler
    recorder, said = log_prob_recorder(Engine(runner), "auto", "processed_logprobs", None)
    assert isinstance(recorder, SamplerLogProbs) and isinstance(runner.sampler, RecordingSampler)
    assert said.startswith("rollout: rollout_log_probs taken at vLLM's sampler (rollout.vllm.log_prob_source = 'auto'")
    assert log_prob_recorder(Engine(Runner({})), "engine", "processed_logprobs", None) == (None, None)


def test_auto_falls_back_to_vllms_own_log_probs_saying_why_where_sampler_is_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="9.9.9"))
    unknown = SimpleNamespace(sampler=inner_sampler)  # neither runner's rows
    recorder, said = log_prob_recorder(Engine(unknown), "auto", "processed_logprobs", None)
    assert recorder is None and unknown.sampler is inner_sampler
    assert said == ("rollout: rollout_log_probs from vLLM's own output (rollout.vllm.log_prob_source = 'auto': vllm "
                    "9.9.9's model runner keeps its rows neither as the first runner nor as model runner V2 does (the "
                    "sampler, request ids and prompts this reads))")
    with pytest.raises(RlcoreError, match="log_prob_source = 'sampler': vllm 9.9.9's model runner keeps its rows "
                                          "neither"):
        log_prob_recorder(Engine(unknown), "sampler", "processed_logprobs", None)
    cases = [("processed_logits", None, "rollout.vllm.logprobs_mode = 'processed_logits' asks for logits, not log-probs"),
             ("raw_logprobs", {"speculative_config": {"method": "ngram"}},
              "speculative decoding (rollout.vllm.engine_kwargs.speculative_config) samples several tokens a step")]
    for mode, engine_kwargs, why in cases:
        runner = Runner({})
        runner.sampler = inner_sampler
        recorder, said = log_prob_recorder(Engine(runner), "auto", mode, engine_kwargs)
        assert recorder is None and runner.sampler is inner_sampler and said.endswith(f"'auto': {why})")
        with pytest.raises(RlcoreError, match=re.escape(f"log_prob_source = 'sampler': {why}; set log_prob_source = "
                                                        "'engine'")):
            log_prob_recorder(Engine(runner), "sampler", mode, engine_kwargs)
