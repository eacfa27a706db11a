"""Adapter-only weight sync: an engine that applies a LoRA actor's adapter itself (it declares
``applies_lora_adapters`` and its job asks for it: ``Rollout.applies_adapter``) keeps ``model.path``'s
base weights and takes only the adapter at each sync (``Rollout.update_adapter``). In lockstep the
hybrid worker hands it the adapter of the actor beside it; in the asynchronous forms the trainer worker
sends the adapter as one bucket over the weight bridge, its config a JSON-encoded uint8 tensor beside
its tensors (``adapter_bucket``), and the rollout worker unpacks it (``unpacked_adapter``)."""

from __future__ import annotations

import json
from collections.abc import Iterable

import torch

from rlcore.errors import RlcoreError

Adapter = tuple[dict, dict[str, torch.Tensor]]  # PEFT's adapter_config.json as a dict, its tensors by PEFT's names
# the bucket entry that carries the adapter's config; no model or PEFT tensor is named so
CONFIG_ENTRY = "rlcore.adapter_config.json"


def takes_adapter(engine, rollout) -> bool:
    """Whether syncs hand ``rollout`` (built by the registered ``engine``) only the actor's adapter: its
    job asked for it (``rollout.applies_adapter``), which only an engine declaring
    ``applies_lora_adapters`` may do."""
    if rollout.applies_adapter and not engine.applies_lora_adapters:
        raise RlcoreError(f"the rollout engine {type(rollout).__name__} applies LoRA adapters itself "
                          "(Rollout.applies_adapter) but its registration does not declare applies_lora_adapters")
    return bool(rollout.applies_adapter)


def actor_adapter(actor) -> Adapter:
    """The actor's adapter for the engine (a collective: every rank of the actor calls it)."""
    adapter = actor.adapter_for_rollout()
    if adapter is None:
        raise RlcoreError(f"the rollout engine applies the actor's LoRA adapter itself, but the actor "
                          f"({type(actor).__name__}) hands out no adapter: it trains no LoRA adapters (set "
                          "model.lora_rank) or its backend cannot hand them out; set the engine's own option to take "
                          "merged weights")
    return adapter


def adapter_bucket(adapter_config: dict, tensors: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """The adapter as one bucket for the weight bridge: its config first (on the tensors' device, as the
    bridge sends a bucket from one device), then its tensors."""
    device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
    encoded = torch.frombuffer(bytearray(json.dumps(adapter_config).encode()), dtype=torch.uint8).to(device)
    return [(CONFIG_ENTRY, encoded), *tensors.items()]


def unpacked_adapter(buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> Adapter:
    """The adapter config and tensors out of the buckets ``adapter_bucket`` made."""
    tensors = dict(named for bucket in buckets for named in bucket)
    if CONFIG_ENTRY not in tensors:
        raise RlcoreError("internal: the engine applies LoRA adapters, but the weights it was sent carry no "
                          "adapter config (merged weights were sent)")
    config = json.loads(bytes(tensors.pop(CONFIG_ENTRY).cpu().tolist()).decode())
    return config, tensors
