"""Adapter-only LoRA sync in the colocated asynchronous form (``rollout.vllm.lora_sync = 'adapter'``): a
trainer worker with a LoRA actor sends only its adapter over the weight bridge, by the route the
colocated form takes on this platform, to a rollout worker whose vllm engine has no actor beside it;
after each update and sync the engine's greedy tokens are the updated actor's (its merged model in
transformers), only adapter tensors crossed the bridge, and the adapter went into vLLM from memory (no
folder written, no adapter file read; vLLM holds the newest version alone). The two workers run in this
process, the two ends of the bridge in two threads (Ray runs them in two processes: the whole job is in
``test_async.py``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import attrs
import pytest
import torch

from rlcore.asynchronous.bridge import colocated_route
from rlcore.asynchronous.config import AsyncConfig
from rlcore.batch import Batch
from rlcore.models.loading import load_tokenizer
from rlcore.runtime.rendezvous import host_store
from rlcore.rollout.adapters import CONFIG_ENTRY
from rlcore.testing import build_actor
from rlcore.training.roles import SamplingParams
from rlcore_vllm.options import VllmOptions
from tests.fsdp.helpers import evolve, job
from tests.vllm.conftest import VLLM_MISSING, files_touched

pytest.importorskip("vllm", reason=VLLM_MISSING)

from rlcore.asynchronous.workers import POLICY_VERSION, AsyncHybridWorker, RolloutWorker  # noqa: E402
from rlcore.config.schema import DataConfig  # noqa: E402
from tests.vllm.test_engine import (  # noqa: E402
    GREEDY,
    LENGTH,
    LOG_PROB_ATOL,
    QUESTIONS,
    lora_slots,
    plain_model,
    transformers_greedy,
)

SYNC_TIMEOUT_S = 120


def linear_layers(engine_model) -> list[str]:
    """The names of the base model's linear layers but the output head: what ``all-linear`` adapts."""
    model = plain_model(engine_model)
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name != "lm_head"]


def sync(trainer: AsyncHybridWorker, rollout: RolloutWorker, version: int, pool: ThreadPoolExecutor) -> int:
    """One weight sync: the trainer worker sends (a thread of its own) while the rollout worker stages;
    returns the bytes sent."""
    sent = pool.submit(trainer.send_weights)
    rollout.receive_weights(version)
    return sent.result(timeout=SYNC_TIMEOUT_S)


def test_in_the_colocated_form_only_the_adapter_crosses_the_bridge_and_the_engine_generates_as_the_actor(
        backend, platform, engine_model):
    config = job(engine_model, lr=0.05, rollout={"name": "vllm", "gpu_memory_utilization": 0.1})
    config = evolve(config, model={"lora_rank": 4, "lora_alpha": 8.0})
    config = attrs.evolve(config, data=DataConfig(max_prompt_length=32, max_response_length=LENGTH), sections={
        "rollout.vllm": VllmOptions(enforce_eager=True, lora_sync="adapter"),
        "async_training": AsyncConfig(mode="colocated")})
    tokenizer = load_tokenizer(str(engine_model))
    encoded = tokenizer(QUESTIONS, return_tensors="pt", padding=True)
    prompts = Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})

    trainer = AsyncHybridWorker(config, None, ("actor",), rank=0, world_size=1, processes_per_node=1)
    trainer.actor = actor = build_actor(backend, config, platform)
    rollout = RolloutWorker(config, None, ("rollout",), rank=0, world_size=1, processes_per_node=1)
    rollout.setup("the process group is the actor's")
    rollout.start_engine()  # from model.path, LoRA enabled
    assert rollout.rollout.actor is None and rollout.takes_adapter()

    route, address = colocated_route(platform), host_store("127.0.0.1", 2)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # as AsyncTrainer joins them: the senders learn that the engines take the adapter alone
        joined = pool.submit(trainer.join_bridge, address, 0, 2, route, rollout.takes_adapter())
        rollout.join_bridge(address, 1, 2, route)
        joined.result(timeout=SYNC_TIMEOUT_S)

        adapted = linear_layers(engine_model)
        full_model_bytes = sum(p.numel() * p.element_size() for p in plain_model(engine_model).parameters())
        assert sync(trainer, rollout, 0, pool) > 0  # the initial adapter, as a job's start sends it
        batch = rollout.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=LENGTH, seed=2))
        advantages = torch.tensor([1.0, -1.0] * len(QUESTIONS)).unsqueeze(-1).expand(-1, LENGTH).contiguous()
        requests = []
        for version in (1, 2):
            for _ in range(2):
                actor.update(batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": advantages})))
            with files_touched() as touched:
                sent = sync(trainer, rollout, version, pool)

            # what crossed the bridge, as the rollout worker staged it: the adapter's config and its A and B
            # of every adapted layer, nothing of the base model
            staged_version, buckets = rollout.staged
            crossed = {name: tensor for bucket in buckets for name, tensor in bucket}
            assert staged_version == version
            names = sorted(set(crossed) - {CONFIG_ENTRY})
            assert CONFIG_ENTRY in crossed and len(crossed) == 1 + 2 * len(adapted)
            assert names == sorted(f"base_model.model.{layer}.lora_{part}.weight" for layer in adapted
                                   for part in "AB")
            tensor_bytes = sum(t.numel() * t.element_size() for name, t in crossed.items() if name != CONFIG_ENTRY)
            assert tensor_bytes == sum(4 * 4 * (m.in_features + m.out_features) for name, m in
                                       plain_model(engine_model).named_modules() if name in adapted)  # fp32, r 4
            assert sent == tensor_bytes + crossed[CONFIG_ENTRY].numel() and sent < full_model_bytes / 5

            engine = rollout.rollout
            with files_touched() as taking:  # the engine takes the staged adapter as it starts generating
                out = rollout.generate(prompts, GREEDY)
            assert touched == [] and taking == []
            requests.append(engine.adapter.request.lora_int_id)
            assert engine.adapter.loaded() == {requests[-1]} and requests[-1] in lora_slots(engine)
            assert out[POLICY_VERSION].tolist() == [version] * len(QUESTIONS)
            merged = plain_model(engine_model, {name: tensor.float() for bucket in actor.weights_for_rollout(2**20)
                                                for name, tensor in bucket})
            expected = transformers_greedy(merged, prompts, tokenizer.pad_token_id, tokenizer.eos_token_id)
            assert torch.equal(out["responses"], expected[:, :LENGTH])
            mask = out["response_mask"].bool()
            torch.testing.assert_close(out["rollout_log_probs"][mask], actor.compute_log_prob(out)["old_log_probs"][mask],
                                       atol=LOG_PROB_ATOL, rtol=LOG_PROB_ATOL)
        fresh = transformers_greedy(plain_model(engine_model), prompts, tokenizer.pad_token_id, tokenizer.eos_token_id)
        assert not torch.equal(out["responses"], fresh[:, :LENGTH])  # the adapter changed what the engine says
    # the first sync of the loop wrote into the adapter the job's start registered, in place: one LoRA id
    assert requests == [requests[0], requests[0]] and rollout.rollout.adapter.in_place_writes == 2
    trainer.bridge.close()
    rollout.bridge.close()
