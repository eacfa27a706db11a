"""The Megatron side of the backend: parallel layout, building a ``GPTModel`` from a Hugging Face
folder, loading its weights shard by shard, and reading them back out with Hugging Face names.

megatron-core is imported inside the functions (``import_megatron`` first), so this module imports
on machines without it. Megatron keeps one parallel layout per process (``parallel_state``): the
first role built sets it up and the others must ask for the same one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import attrs
import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlcore.api import RlcoreError, quiet_loading, resolve_model_path
from rlcore_megatron.config_map import (
    ModelShape,
    MoeSettings,
    PipelineSplit,
    gpt_model_kwargs,
    model_shape,
    transformer_config_kwargs,
)
from rlcore_megatron.weights import (
    COLUMN,
    ROW,
    Named,
    expert_range,
    global_name,
    hf_tensors,
    is_expert,
    local_name,
    megatron_tensor,
    parallel_kind,
    stage_layers,
    strip_wrappers,
    tp_merge,
    tp_shard,
)

log = logging.getLogger(__name__)

INSTALL = "pip install rlcore[megatron]"


def import_megatron():
    """``megatron.core``, or one error that says how to install it."""
    try:
        import megatron.core
        from megatron.core.models.gpt import GPTModel  # noqa: F401 - fails without its own dependencies
    except ImportError as exc:
        raise RlcoreError(f"trainer.backend = 'megatron' needs megatron-core, which does not import here ({exc}); "
                          f"install it with: {INSTALL} (megatron-core needs Python >= 3.12, torch and, at import, "
                          "triton; it runs on GPUs only)") from None
    return megatron.core


@attrs.frozen
class Layout:
    """This rank's place in the Megatron layout (tensor x context x data x pipeline parallel)."""

    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    expert_parallel: int = 1
    ep_rank: int = 0
    context_parallel: int = 1
    cp_rank: int = 0

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pipeline_parallel - 1


def current_layout() -> Layout:
    from megatron.core import parallel_state as ps

    return Layout(ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
                  ps.get_data_parallel_world_size(), ps.get_tensor_model_parallel_rank(),
                  ps.get_pipeline_model_parallel_rank(), ps.get_data_parallel_rank(),
                  ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_rank(),
                  ps.get_context_parallel_world_size(), ps.get_context_parallel_rank())


def expert_offset(shape: ModelShape, layout: Layout) -> int:
    """The global number of this rank's first expert (0 for a dense model)."""
    if shape.experts is None:
        return 0
    return expert_range(shape.experts.count, layout.expert_parallel, layout.ep_rank).start


def setup_parallel(tp: int, pp: int, section: str, seed: int, ep: int = 1, cp: int = 1) -> Layout:
    """Megatron's process groups over the worker's process group (set up by the worker, or by
    ``rlcore.runtime.distributed.ensure_process_group``), seeded; or the layout an earlier role set up,
    which ``tp``, ``pp``, ``ep`` (expert parallel) and ``cp`` (context parallel) must match."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        layout = current_layout()
        theirs = (layout.tensor_parallel, layout.pipeline_parallel, layout.expert_parallel, layout.context_parallel)
        if theirs != (tp, pp, ep, cp):
            raise RlcoreError(f"{section}: tensor/pipeline/expert/context parallel sizes {tp}/{pp}/{ep}/{cp} differ "
                              f"from the {'/'.join(map(str, theirs))} another role of this worker set up; actor, ref "
                              "and critic share one Megatron layout")
        _seed_megatron_rng(seed)  # groups made elsewhere (a user's script, a test) may come unseeded
        return layout
    world = dist.get_world_size()
    if world % (tp * pp * cp):
        raise RlcoreError(f"{section}: tensor_model_parallel_size x pipeline_model_parallel_size x "
                          f"context_parallel_size = {tp * pp * cp} does not divide the {world} workers "
                          "(trainer.n_gpus_per_node x trainer.nnodes)")
    if (world // (tp * pp)) % ep:
        raise RlcoreError(f"{section}: expert_model_parallel_size = {ep} does not divide the "
                          f"{world // (tp * pp)} data- and context-parallel ranks")
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 expert_model_parallel_size=ep, context_parallel_size=cp)
    model_replica_group()  # made now, while every rank is here, rather than inside a later phase
    _seed_megatron_rng(seed)
    return current_layout()


_REPLICA_GROUPS: dict = {}


def model_replica_group():
    """The ranks that hold one copy of the model between them and compute the same rows: the
    model-parallel group (TP x PP), with the context-parallel ranks too under context parallelism
    (megatron-core has no such group; it is made once, every rank taking part)."""
    from megatron.core import parallel_state as ps

    if ps.get_context_parallel_world_size() == 1:
        return ps.get_model_parallel_group()
    key = id(ps.get_context_parallel_group())  # a new layout (a test's) makes new groups
    if key not in _REPLICA_GROUPS:
        # the ranks of one replica are those with the same data-parallel rank
        dp_ranks = [None] * dist.get_world_size()
        dist.all_gather_object(dp_ranks, ps.get_data_parallel_rank())
        members = [[rank for rank, dp in enumerate(dp_ranks) if dp == index] for index in sorted(set(dp_ranks))]
        _REPLICA_GROUPS[key], _ = dist.new_subgroups_by_enumeration(members)
    return _REPLICA_GROUPS[key]


def _seed_megatron_rng(seed: int) -> None:
    """Megatron's own random-number streams (model-parallel and data-parallel), which its forward
    forks; once per process."""
    from megatron.core import tensor_parallel

    if "model-parallel-rng" not in tensor_parallel.get_cuda_rng_tracker().get_states():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def read_hf_config(path: str, trust_remote_code: bool):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(resolve_model_path(path), trust_remote_code=trust_remote_code)


class ValueHead(nn.Module):
    """The critic's scalar head in place of the output layer: ``weight`` (1, hidden) and ``bias`` (1,),
    the same on every tensor-parallel rank; called as Megatron calls its output layer."""

    def __init__(self, hidden_size: int, bias: bool, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, hidden_size, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(1, dtype=dtype, device=device)) if bias else None

    def forward(self, hidden_states: Tensor, weight: Tensor | None = None, runtime_gather_output=None, **_):
        return nn.functional.linear(hidden_states, self.weight, self.bias), None


def build_model(shape: ModelShape, layout: Layout, dtype: torch.dtype, device: torch.device, *,
                value_head: bool = False, gradient_checkpointing: bool = False,
                recompute: dict | None = None, moe: MoeSettings | None = None,
                split: PipelineSplit = PipelineSplit()) -> nn.Module:
    """This rank's stage of a ``GPTModel`` (local layer spec), parameters in ``dtype`` on ``device``,
    uninitialised: ``load_hf_weights`` fills every one. ``moe``: how a mixture of experts routes and
    dispatches (unset: megatron's defaults as rlcore sets them, the dispatcher picked by ``device``);
    ``split``: the layers of each pipeline stage."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        **transformer_config_kwargs(shape, tensor_parallel=layout.tensor_parallel,
                                    pipeline_parallel=layout.pipeline_parallel, dtype=dtype,
                                    gradient_checkpointing=gradient_checkpointing, recompute=recompute,
                                    expert_parallel=layout.expert_parallel,
                                    # gloo has no all-to-all, and the alltoall dispatcher makes a CUDA stream
                                    moe=moe or MoeSettings("allgather" if device.type == "cpu" else "alltoall"),
                                    split=split, context_parallel=layout.context_parallel),
        perform_initialization=False,
        # Megatron places new parameters on its own idea of the current device; on the CPU (tests
        # with shims) they are built in CPU memory instead.
        use_cpu_initialization=device.type == "cpu",
    )
    spec = get_gpt_layer_local_spec(num_experts=shape.experts.count if shape.experts else None,
                                    moe_grouped_gemm=False, qk_layernorm=shape.qk_layernorm, normalization="RMSNorm")
    if layout.context_parallel > 1:  # the local DotProductAttention refuses context parallelism
        from rlcore_megatron.context_parallel import ulysses_attention_class

        spec.submodules.self_attention.submodules.core_attention = ulysses_attention_class()
    model = GPTModel(config, spec,
                     pre_process=layout.first_stage, post_process=layout.last_stage,
                     **gpt_model_kwargs(shape, tensor_parallel=layout.tensor_parallel, value_head=value_head))
    if value_head and layout.last_stage:
        model.output_layer = ValueHead(shape.hidden_size, shape.value_head_bias, dtype, device)
    return model.to(device=device, dtype=dtype)


def stage_offset(model: nn.Module, shape: ModelShape, layout: Layout) -> int:
    """The global number of this stage's first layer, by the split the model was built with."""
    config = model.config
    split = PipelineSplit.of(config)
    return stage_layers(shape.num_layers, layout.pipeline_parallel, layout.pp_rank, split).start


# -- Hugging Face checkpoint -> this rank's shards ---------------------------------------------------
class HfCheckpoint:
    """Tensors of a Hugging Face folder read one at a time by name (safetensors, single or indexed);
    a folder with only ``.bin`` weights is loaded whole through transformers."""

    def __init__(self, path: str, trust_remote_code: bool = False):
        self.folder = Path(resolve_model_path(path))
        self.trust_remote_code = trust_remote_code
        index = self.folder / "model.safetensors.index.json"
        single = self.folder / "model.safetensors"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.files = {name: self.folder / file for name, file in weight_map.items()}
        elif single.is_file():
            from safetensors import safe_open

            with safe_open(str(single), framework="pt") as handle:
                self.files = dict.fromkeys(handle.keys(), single)
        else:
            self.files = None
            self._whole: dict[str, Tensor] | None = None

    def names(self) -> set[str]:
        return set(self.files) if self.files is not None else set(self._load_whole())

    def __contains__(self, name: str) -> bool:
        return name in self.names()

    def read(self, name: str) -> Tensor:
        if self.files is None:
            return self._load_whole()[name]
        if name not in self.files:
            raise RlcoreError(f"{self.folder} has no tensor {name!r}")
        from safetensors import safe_open

        with safe_open(str(self.files[name]), framework="pt") as handle:
            return handle.get_tensor(name)

    def _load_whole(self) -> dict[str, Tensor]:
        if self._whole is None:
            from transformers import AutoModelForCausalLM

            log.warning("%s has no safetensors weights: loading the whole model on the CPU", self.folder)
            with quiet_loading():
                model = AutoModelForCausalLM.from_pretrained(self.folder, dtype=torch.float32,
                                                             trust_remote_code=self.trust_remote_code)
            self._whole = dict(model.state_dict())
        return self._whole


def load_hf_weights(model: nn.Module, checkpoint: HfCheckpoint, shape: ModelShape, layout: Layout, *,
                    value_head: bool = False, seed: int = 0) -> None:
    """Every parameter of this rank's stage from the Hugging Face checkpoint, converted to Megatron's
    layout and cut to this tensor-parallel rank's share. A critic made from a causal-LM checkpoint
    (no ``score.weight``) gets a new value head, the same on every rank (from ``seed``)."""
    offset = stage_offset(model, shape, layout)
    experts = expert_offset(shape, layout)
    fresh_head = value_head and "score.weight" not in checkpoint
    params = dict(model.named_parameters())
    with torch.no_grad():
        for local, param in params.items():
            name = global_name(strip_wrappers(local), offset, experts)
            if fresh_head and name.startswith("output_layer."):
                full = _new_head_tensor(name, param, shape, seed)
            else:
                full = megatron_tensor(name, checkpoint.read, shape, tensor_parallel=layout.tensor_parallel,
                                       value_head=value_head)
            shard = tp_shard(name, full, layout.tensor_parallel, layout.tp_rank, value_head=value_head)
            if shard.shape != param.shape:
                raise RlcoreError(f"{checkpoint.folder}: {name} converts to shape {tuple(shard.shape)} on tensor-"
                                  f"parallel rank {layout.tp_rank}, the model holds {tuple(param.shape)}")
            param.copy_(shard)


def _new_head_tensor(name: str, param: Tensor, shape: ModelShape, seed: int) -> Tensor:
    """A new value head's ``weight`` (normal, the model's initializer range, from ``seed``) or ``bias``
    (zeros): the same on every rank."""
    if name.endswith("weight"):
        return torch.randn(param.shape, generator=torch.Generator().manual_seed(seed)) * shape.initializer_range
    return torch.zeros(param.shape)


def new_value_head(model: nn.Module, shape: ModelShape, layout: Layout, seed: int) -> None:
    """The critic's value head made new, as ``load_hf_weights`` makes it for a causal-LM checkpoint
    (the last stage holds it)."""
    if not layout.last_stage:
        return
    with torch.no_grad():
        for local, param in model.named_parameters():
            name = strip_wrappers(local)
            if name.startswith("output_layer."):
                param.copy_(_new_head_tensor(name, param, shape, seed))


# -- this rank's shards -> full Hugging Face tensors on every rank ---------------------------------
def _tp_gathered(tensor: Tensor, layout: Layout, expert: bool = False) -> list[Tensor]:
    """Every tensor-parallel rank's share (an expert's: over the expert-tensor-parallel group)."""
    from megatron.core import parallel_state as ps

    if layout.tensor_parallel == 1:
        return [tensor]
    group = ps.get_expert_tensor_parallel_group() if expert else ps.get_tensor_model_parallel_group()
    shards = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shards, tensor.contiguous(), group=group)
    return shards


def _ep_gathered(name: str, full: Tensor, shape: ModelShape, layout: Layout) -> list[Named]:
    """The same expert parameter of every expert-parallel rank, with its global name: this rank's
    ``name`` is expert e, rank r's is expert e + (r - this rank) x experts per rank."""
    from megatron.core import parallel_state as ps

    if layout.expert_parallel == 1:
        return [(name, full)]
    tensors = [torch.empty_like(full) for _ in range(layout.expert_parallel)]
    dist.all_gather(tensors, full.contiguous(), group=ps.get_expert_model_parallel_group())
    local = local_name(name, 0, expert_offset(shape, layout))
    per_rank = shape.experts.count // layout.expert_parallel
    return [(global_name(local, 0, rank * per_rank), tensor) for rank, tensor in enumerate(tensors)]


def hf_weight_stream(model: nn.Module, shape: ModelShape, layout: Layout, dtype: torch.dtype, *,
                     value_head: bool = False) -> Iterator[Named]:
    """Full Hugging Face tensors in ``dtype`` on this rank's device, on every rank, one Megatron
    parameter at a time: stage by stage, each stage's tensor-parallel shards are gathered and then
    broadcast from that stage to the others; a mixture of experts' experts are gathered over the
    expert-parallel ranks. Every rank of the job must take part."""
    from megatron.core import parallel_state as ps

    pp_group = ps.get_pipeline_model_parallel_group()
    device = next(model.parameters()).device
    offset = stage_offset(model, shape, layout)
    experts = expert_offset(shape, layout)  # the same for the ranks of one pipeline group
    mine = [(global_name(strip_wrappers(n), offset, experts), p) for n, p in model.named_parameters()]
    for stage in range(layout.pipeline_parallel):
        # the stage's parameter names and full shapes, told to the other stages once
        listing = [[(name, list(_full_shape(name, p, layout, value_head))) for name, p in mine]
                   if stage == layout.pp_rank else None]
        if layout.pipeline_parallel > 1:
            dist.broadcast_object_list(listing, src=dist.get_global_rank(pp_group, stage), group=pp_group)
        local = dict(mine) if stage == layout.pp_rank else {}
        for name, full_shape in listing[0]:
            if name == "output_layer.weight" and shape.tied_embeddings and not value_head:
                continue  # the last stage's copy of the embedding, which the first stage sends
            if stage == layout.pp_rank:
                shard = local[name].detach().to(dtype)
                full = tp_merge(name, _tp_gathered(shard, layout, is_expert(name)), value_head=value_head)
            else:
                full = torch.empty(full_shape, dtype=dtype, device=device)
            if layout.pipeline_parallel > 1:
                dist.broadcast(full, src=dist.get_global_rank(pp_group, stage), group=pp_group)
            for each_name, each in (_ep_gathered(name, full, shape, layout) if is_expert(name) else [(name, full)]):
                yield from hf_tensors(each_name, each, shape, value_head=value_head)


def _full_shape(name: str, param: Tensor, layout: Layout, value_head: bool) -> torch.Size:
    kind = parallel_kind(name, value_head=value_head)
    shape = list(param.shape)
    if kind == COLUMN:
        shape[0] *= layout.tensor_parallel
    elif kind == ROW:
        shape[1] *= layout.tensor_parallel
    return torch.Size(shape)


def shape_of(path: str, trust_remote_code: bool) -> tuple[object, ModelShape]:
    """The Hugging Face config of ``path`` and what Megatron needs of it."""
    hf_config = read_hf_config(path, trust_remote_code)
    return hf_config, model_shape(hf_config)

