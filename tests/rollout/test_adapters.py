"""Adapter-only sync (rlcore.rollout.adapters): the adapter as one bridge bucket and back, and which
engines syncs hand the adapter alone (the vllm engine's own checks: tests/vllm/test_plugin.py)."""

from __future__ import annotations

import json

import pytest
import torch

from rlcore.errors import RlcoreError
from rlcore.rollout.adapters import CONFIG_ENTRY, actor_adapter, adapter_bucket, takes_adapter, unpacked_adapter
from rlcore.rollout.declared import RolloutEngine

PEFT_CONFIG = {"peft_type": "LORA", "r": 4, "lora_alpha": 8.0, "target_modules": ["q_proj", "v_proj"],
               "base_model_name_or_path": "tiny-qwen2"}


def adapter_tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 64, generator=generator),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.randn(64, 4, generator=generator),
            "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight":
                torch.randn(4, 64, generator=generator).bfloat16()}


def test_the_adapter_travels_as_one_bucket_its_config_a_byte_tensor_beside_its_tensors():
    tensors = adapter_tensors()
    bucket = adapter_bucket(PEFT_CONFIG, tensors)
    names = [name for name, _ in bucket]
    assert names == [CONFIG_ENTRY, *tensors]
    encoded = dict(bucket)[CONFIG_ENTRY]
    assert encoded.dtype == torch.uint8 and json.loads(bytes(encoded.tolist())) == PEFT_CONFIG
    # as the weight bridge hands buckets over: each tensor a copy, possibly split over several buckets
    arrived = [[(name, tensor.clone()) for name, tensor in bucket[:2]], [(n, t.clone()) for n, t in bucket[2:]]]
    config, received = unpacked_adapter(iter(arrived))
    assert config == PEFT_CONFIG
    assert list(received) == list(tensors)
    for name, tensor in tensors.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor)


def test_merged_weights_are_not_taken_for_an_adapter():
    with pytest.raises(RlcoreError, match="carry no adapter config"):
        unpacked_adapter([[("model.embed_tokens.weight", torch.zeros(2, 2))]])


class Engine:
    """A rollout as an engine builds it: only what takes_adapter reads."""

    def __init__(self, applies_adapter: bool):
        self.applies_adapter = applies_adapter


def test_only_an_engine_that_declares_applies_lora_adapters_and_asks_for_them_gets_the_adapter_alone():
    declaring, plain = RolloutEngine(Engine, applies_lora_adapters=True), RolloutEngine(Engine)
    assert takes_adapter(declaring, Engine(True))
    assert not takes_adapter(declaring, Engine(False))  # its job keeps merged weights
    assert not takes_adapter(plain, Engine(False))
    with pytest.raises(RlcoreError, match="does not declare applies_lora_adapters"):
        takes_adapter(plain, Engine(True))


def test_an_actor_without_adapters_is_refused_naming_what_to_set():
    class PlainActor:
        def adapter_for_rollout(self):
            return None

    with pytest.raises(RlcoreError, match=r"hands out no adapter: it trains no LoRA adapters \(set model.lora_rank\)"):
        actor_adapter(PlainActor())
