"""The rollout-engine contract: what an engine registers (``rlcore_register_rollout_engines``,
``rollout.name``) is a ``RolloutEngine``, its builder and its declared capabilities with their defaults
here, as a training backend declares its capabilities on ``TrainingBackend``. The core reads them one
way (``engine.returns_routed_experts``); a misspelled capability fails the plugin's registration,
naming the plugin, instead of reading as false."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from rlcore.errors import RlcoreError

# capability -> what it declares (docs/plugins.md lists them from here)
CAPABILITIES = {
    "colocated_faster_on_one_device": "async_training.mode = 'auto' runs the colocated asynchronous form on one "
                                      "device with this engine (measured faster there than lockstep)",
    "returns_routed_experts": "rollout.return_routed_experts: its rows carry the experts a mixture of experts "
                              "chose (router replay R3)",
    "takes_weights_mid_generation": "async_training.partial_rollout: it loads the weights a sync brought between "
                                    "two of its steps, without ending the running requests",
    "borrows_actor_module": "it generates with an actor's own module (the asynchronous forms lend it a copy)",
    "applies_lora_adapters": "it applies a LoRA actor's adapter itself where its job asks it to (Rollout.applies_adapter): "
                             "each sync, in lockstep and in the asynchronous forms, hands it only the adapter "
                             "(Rollout.update_adapter), never the merged weights",
    "computes_in_worker_process": "its model runs in the worker's own process (no server or scheduler process of "
                                  "its own), so profiler.steps traces its generation too",
    "takes_images": "prompts with images (rows carrying multi_modal_inputs, rlcore.data.vision): it generates "
                    "with them",
}


@attrs.frozen
class RolloutEngine:
    """A registered rollout engine: ``build(spec, platform, actor)`` returns its ``rlcore.api.Rollout``
    (calling the engine calls ``build``), ``spec`` being the ``rlcore.api.RolloutSpec`` the driver computed
    (the ``[rollout]`` and ``[model]`` tables, the seed, the context length, the plugin tables);
    ``requires``: the modules it imports, checked before a job starts; the rest are its capabilities
    (``CAPABILITIES``), all off unless declared."""

    build: Callable[..., Any]
    requires: tuple[str, ...] = ()
    colocated_faster_on_one_device: bool = False
    returns_routed_experts: bool = False
    takes_weights_mid_generation: bool = False
    borrows_actor_module: bool = False
    applies_lora_adapters: bool = False
    takes_images: bool = False
    computes_in_worker_process: bool = False

    def __call__(self, spec, platform, actor):
        return self.build(spec, platform, actor)


def rollout_engine(manager, name: str) -> RolloutEngine:
    """The engine registered as ``name``; an error naming its plugin when the registered object is not
    a ``RolloutEngine``."""
    entry = manager.registry("rollout_engines").entry(name)
    if isinstance(entry.value, RolloutEngine):
        return entry.value
    raise RlcoreError(f"rollout engine {name!r} registered by {entry.provider} is a {type(entry.value).__name__}; "
                      "expected an rlcore.api.RolloutEngine (its builder and its declared capabilities)")


def engine_declares(manager, name: str | None, capability: str) -> bool:
    """Whether the engine registered as ``name`` declares ``capability`` (False for an unknown name)."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown rollout-engine capability {capability!r}; known: {', '.join(CAPABILITIES)}")
    return name in manager.registry("rollout_engines") and getattr(rollout_engine(manager, name), capability)


def engines_declaring(manager, capability: str) -> list[str]:
    """The registered engines that declare ``capability``."""
    return [name for name in manager.registry("rollout_engines").names() if engine_declares(manager, name, capability)]
