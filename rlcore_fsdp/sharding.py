"""FSDP2 wrapping of a Hugging Face model, and reading its full parameters back out.

Each decoder layer is its own ``fully_shard`` unit (all-gathered just before it runs and freed after),
then the root (embeddings, final norm, head). Parameter names stay the Hugging Face ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlcore.api import Platform
from rlcore_fsdp.distributed import data_parallel_mesh
from rlcore_fsdp.lora import PEFT_PREFIX, LoraLinear, hf_name, merge, peft_adapter
from rlcore_fsdp.options import FsdpOptions


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the classes transformers names in ``_no_split_modules``."""
    block_names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in block_names]
    if not layers:  # a model without the hint: the longest ModuleList is the stack of layers
        lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
        layers = list(max(lists, key=len)) if lists else []
    return layers


# Dynamo's recompiles of one frame before it runs that frame eager for good (its default is 8), for layers
# under gradient checkpointing: transformers' checkpointing wrapper is a frame of its own, entered with two
# closures (FSDP's subclass of the layer wraps it again), with and without gradients, and in the backward's
# replay, each also with static and then dynamic shapes. On the CPU probe (benchmarks/compile_probe.py, 2
# layers) that used up the default within step 1 (the frame then ran eager); 29 recompiles in all, none
# after step 1, with room.
CHECKPOINTED_RECOMPILE_LIMIT = 32


def compile_layers(model: nn.Module) -> None:
    """``torch.compile`` each decoder layer in place, as torchtitan does, before it is sharded: each
    layer's forward and backward run as compiled graphs, FSDP's gathers stay outside them. Shapes
    change from micro-batch to micro-batch, so torch marks them dynamic after the first recompile.
    Layers under gradient checkpointing need more recompiles than dynamo allows a frame by default
    (``CHECKPOINTED_RECOMPILE_LIMIT``): the process's limit is raised to it."""
    if getattr(model, "is_gradient_checkpointing", False):
        import torch._dynamo

        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, CHECKPOINTED_RECOMPILE_LIMIT)
    for layer in decoder_layers(model):
        layer.compile()


def shard_model(model: nn.Module, platform: Platform, fsdp: FsdpOptions, compute_dtype: torch.dtype) -> nn.Module:
    """``model`` sharded in place over the data-parallel mesh (``fsdp.fsdp_size``: hybrid sharding); it
    computes in ``compute_dtype``
    (its parameters, the master copy the optimizer updates, keep the dtype they were loaded in) and
    reduces gradients in fp32. With ``fsdp.param_offload`` the shards stay in CPU memory: each unit
    is copied to the device for its all-gather, gradients come back to the CPU, where the optimizer
    steps (FSDP2's ``CPUOffloadPolicy``)."""
    mesh = data_parallel_mesh(platform, fsdp.fsdp_size)
    stored_dtype = next(model.parameters()).dtype
    mixed = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32) \
        if compute_dtype != stored_dtype else MixedPrecisionPolicy()
    if fsdp.param_offload:
        offload_policy = CPUOffloadPolicy(pin_memory=platform.device_type != "cpu")
    else:
        offload_policy = OffloadPolicy()
        model.to(platform.device())
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=fsdp.reshard_after_forward, mp_policy=mixed,
                    offload_policy=offload_policy)
    fully_shard(model, mesh=mesh, mp_policy=mixed, offload_policy=offload_policy)
    return model


def accumulates_unreduced(model: nn.Module, fsdp: FsdpOptions) -> bool:
    """Whether a mini-batch's micro-batches may accumulate their gradients unreduced, reduced once after the
    last: a model sharded over one device (nothing to reduce with: FSDP's reduction of each layer after each
    micro-batch only copies, at a cost of host time per layer), its parameters kept on the device (offloaded,
    the unreduced gradients would stay on the device). The gradients accumulate in the reduce dtype (fp32),
    as the reduced ones do."""
    if not isinstance(model, FSDPModule) or fsdp.param_offload:
        return False
    param = next(model.parameters(), None)
    return isinstance(param, DTensor) and param.device_mesh.size() == 1


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (a collective for a sharded one)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def gathered_parameter(param: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The whole parameter in ``dtype`` on ``device``, on every rank: each shard is cast and moved
    first (an offloaded shard sits in CPU memory), so the all-gather moves the smaller dtype."""
    if not isinstance(param, DTensor):
        return param.to(device=device, dtype=dtype)
    local = param.to_local().to(device=device, dtype=dtype)
    shard = DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                               shape=param.shape, stride=param.stride())
    return shard.full_tensor()


def gathered_peft_adapter(model: nn.Module, lora: dict, base_model: str, *, dtype: torch.dtype | None = None,
                          device: torch.device | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """A LoRA model's adapters whole on every rank (a collective), then in ``dtype`` on ``device``
    (default: the parameters' own), as PEFT's adapter config and tensors (``lora.peft_adapter``)."""
    trained = {name: full_tensor(param.detach()).to(device=device or param.device, dtype=dtype or param.dtype)
               for name, param in model.named_parameters() if name.endswith((".lora_A", ".lora_B"))}
    return peft_adapter(trained, model, lora, base_model)


class AdapterGather:
    """``gathered_peft_adapter`` for a sync every step, its per-step Python work done once: the adapter's
    parameters, their PEFT names and PEFT's config are found at construction (the parameters are the
    model's own objects, which training and checkpoint loading update in place), and each call gathers
    all of them in one collective: every rank's shards (FSDP2's ``Shard(0)``, ``torch.chunk``'s rows,
    each padded to the largest shard's rows) cast to ``dtype`` on ``device`` and laid end to end in
    one flat buffer, one all-gather of it, and each whole tensor a contiguous view of the gathered rows
    (a copy where they are strided: over several ranks). The buffer is new at each call, so no tensor
    handed out is overwritten by the next. Parameters sharded otherwise are gathered one by one, as
    before."""

    def __init__(self, model: nn.Module, lora: dict, base_model: str, *, dtype: torch.dtype,
                 device: torch.device):
        from torch.distributed.tensor import Shard

        self.dtype, self.device = dtype, device
        params = {name: param for name, param in model.named_parameters() if name.endswith((".lora_A", ".lora_B"))}
        # PEFT's config and names from meta-device stand-ins: the config depends on the names alone
        config, named = peft_adapter({name: torch.empty(0, device="meta") for name in params}, model, lora,
                                     base_model)
        self.config = config
        # peft_adapter names "<layer>.<part>" as f"{PEFT_PREFIX}<layer>.<part>.weight", in its own order
        self.order = [(peft, params[peft.removeprefix(PEFT_PREFIX).removesuffix(".weight")]) for peft in named]
        self.flat: list[tuple[str, torch.Tensor, int]] = []  # (PEFT name, parameter, rows of the padded shard)
        self.apart: list[tuple[str, torch.Tensor]] = []
        self.mesh = None
        for peft, param in self.order:
            if (isinstance(param, DTensor) and param.device_mesh.ndim == 1 and tuple(param.placements) == (Shard(0),)
                    and param.dim() >= 1 and (self.mesh is None or param.device_mesh == self.mesh)):
                self.mesh = param.device_mesh
                world = self.mesh.size()
                self.flat.append((peft, param, -(-param.shape[0] // world)))
            else:
                self.apart.append((peft, param))

    def __call__(self) -> tuple[dict, dict[str, torch.Tensor]]:
        tensors: dict[str, torch.Tensor] = {}
        if self.flat:
            tensors.update(self._gathered_flat())
        for peft, param in self.apart:
            tensors[peft] = full_tensor(param.detach()).to(device=self.device, dtype=self.dtype).contiguous()
        return self.config, {peft: tensors[peft] for peft, _ in self.order}

    def _gathered_flat(self) -> dict[str, torch.Tensor]:
        world = self.mesh.size()
        sizes = [rows * _row_numel(param) for _, param, rows in self.flat]
        local = torch.empty(sum(sizes), dtype=self.dtype, device=self.device)
        offset = 0
        with torch.no_grad():
            for (_, param, rows), size in zip(self.flat, sizes):
                shard = param.to_local()
                used = shard.numel()
                if used:
                    local[offset: offset + used].view(shard.shape).copy_(shard)
                if used < size:
                    local[offset + used: offset + size].zero_()
                offset += size
            if world == 1:
                gathered = local.view(1, -1)
            else:
                gathered = torch.empty(world, local.numel(), dtype=self.dtype, device=self.device)
                torch.distributed.all_gather(list(gathered.unbind(0)), local, group=self.mesh.get_group())
        whole, offset = {}, 0
        for (peft, param, rows), size in zip(self.flat, sizes):
            part = gathered[:, offset: offset + size].reshape(world * rows, *param.shape[1:])
            whole[peft] = part[: param.shape[0]].contiguous()  # a copy where the rows are strided
            offset += size
        return whole


def _row_numel(param: torch.Tensor) -> int:
    numel = 1
    for extent in param.shape[1:]:
        numel *= extent
    return numel


def parameter_buckets(model: nn.Module, bucket_bytes: int, dtype: torch.dtype, device: torch.device
                      ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Full parameters in ``dtype`` on ``device`` with their Hugging Face names, at most
    ``bucket_bytes`` a bucket (a larger single tensor comes alone), gathered one parameter at a time
    as the consumer asks for the next bucket: at most one bucket of full parameters exists at once
    (if the consumer lets go of each). Tied parameters come once, under their first name. A layer
    with LoRA adapters comes merged, as the plain layer (``rlcore_fsdp.lora``)."""
    adapted = {name: module for name, module in model.named_modules() if isinstance(module, LoraLinear)}
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, param in model.named_parameters():
        if name.endswith((".lora_A", ".lora_B")):
            continue  # merged into their layer's weight
        nbytes = param.numel() * dtype.itemsize
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        layer = adapted.get(name.removesuffix(".base.weight")) if name.endswith(".base.weight") else None
        if layer is None:
            full = gathered_parameter(param.detach(), dtype, device)
        else:  # W + scale * B A, merged from the stored (master) precision
            parts = [gathered_parameter(p.detach(), p.dtype, device) for p in (param, layer.lora_A, layer.lora_B)]
            full = merge(*parts, layer.scale).to(dtype)
        bucket.append((hf_name(name), full))
        size += nbytes
    if bucket:
        yield bucket


@contextmanager
def gathered_for_inference(model: nn.Module, reshard_after_forward: bool, device: torch.device):
    """``model`` in eval mode without gradients, all its parameters gathered, until the block ends;
    then sharded again and back in its former mode.

    Generation runs hundreds of forwards of a token or so each: FSDP's hooks around every shard unit
    would cost more than the step itself. So one forward of one token gathers every unit (and keeps
    it gathered), then FSDP's forward hooks are set aside for the block: it runs as a plain module.

    Layers compiled for training (``actor.use_torch_compile``) run eager in the block: decoding with a
    KV cache specializes a layer's graph on its cache and index, and a whole job's generation used up
    dynamo's recompile limit (8) within its first step, after which training's layers ran eager too.
    """
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    was_training = model.training
    model.eval()
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    set_aside: list[tuple[FSDPModule, dict, dict]] = []
    try:
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=False)
            for unit in units:  # those a text forward does not reach (a vision tower's blocks)
                unit.unshard()
            set_aside = [(unit, *_take_fsdp_hooks(unit)) for unit in units]
            yield model
    finally:
        for unit, pre_hooks, post_hooks in set_aside:
            _put_back_fsdp_hooks(unit, pre_hooks, post_hooks)
        for unit in units:
            unit.reshard()
            if unit is not model:  # the root never reshards after forward (FSDP2's default)
                unit.set_reshard_after_forward(reshard_after_forward, recurse=False)
        model.train(was_training)


def _take_fsdp_hooks(unit: FSDPModule) -> tuple[dict, dict]:
    """Remove the unit's own FSDP forward hooks (found by their owner, its FSDP state); a unit whose
    hooks are not found keeps them, which is slower but still right."""
    state = unit._get_fsdp_state()
    pre = {k: h for k, h in unit._forward_pre_hooks.items() if getattr(h, "__self__", None) is state}
    post = {k: h for k, h in unit._forward_hooks.items() if getattr(h, "__self__", None) is state}
    for key in pre:
        del unit._forward_pre_hooks[key]
    for key in post:
        del unit._forward_hooks[key]
    return pre, post


def _put_back_fsdp_hooks(unit: nn.Module, pre: dict, post: dict) -> None:
    unit._forward_pre_hooks.update(pre)
    for key in reversed(pre):  # FSDP's pre-forward hook runs first
        unit._forward_pre_hooks.move_to_end(key, last=False)
    unit._forward_hooks.update(post)
