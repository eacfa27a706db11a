"""A Hugging Face model folder as torchtitan's model: its config mapped onto torchtitan's Llama 3 or
Qwen3 config, its weights converted by torchtitan's own state-dict adapter for that family, the model
parallelised by torchtitan's FSDP2 (``apply_fsdp_to_decoder``, over every rank).

torchtitan 0.3.0 builds its models from named flavors ("8B", "0.6B", ...), not from a Hugging Face config;
the mapping here builds the same ``Llama3Model.Config`` or ``Qwen3Model.Config`` from ``config.json``.
Attention: torchtitan's language-model backends (flex, varlen) want per-document positions and compiled or
CUDA-only kernels; the roles lay each row's real tokens out from position 0 (``rlcore_torchtitan.forward``),
so plain causal attention is exact and torchtitan's ``ScaledDotProductAttention`` serves, on the CPU and on GPUs alike.
"""

from __future__ import annotations

import attrs
import torch
from torch import nn

from rlcore.api import Platform, RlcoreError, load_causal_lm, local_device, world_size

INSTALL = "pip install 'rlcore[torchtitan]'  (torchtitan==0.3.0)"
# Hugging Face model_type -> torchtitan's package for it (its model and state-dict adapter)
FAMILIES = {"llama": "torchtitan.models.llama3", "qwen3": "torchtitan.models.qwen3"}
# rope_parameters["rope_type"] each family's rope computes: Llama's ComplexRoPE (Llama 3 scaling too),
# Qwen3's CosSinRoPE (no Llama scaling)
ROPE_TYPES = {"llama": ("default", "llama3"), "qwen3": ("default",)}
# why the other families of rlcore's family matrix (tests/families.py) are refused, from torchtitan 0.3.0's
# own model packages
NOT_CARRIED = {
    "qwen2": "torchtitan 0.3.0 has no Qwen2 model (its Qwen3 has no q/k/v biases)",
    "qwen3_moe": "torchtitan 0.3.0 has Qwen3 mixture-of-experts models and an adapter (torchtitan.models.qwen3) "
                 "that rlcore does not map yet",
    "gemma2": "torchtitan 0.3.0 has no Gemma model",
    "mistral": "torchtitan 0.3.0 has no Mistral model (no sliding-window attention)",
    "deepseek_v3": "torchtitan 0.3.0 has a DeepSeek-V3 model and adapter (torchtitan.models.deepseek_v3) that "
                   "rlcore does not map yet",
    "phi3": "torchtitan 0.3.0 has no Phi-3 model",
}


def import_torchtitan(family: str = "llama"):
    """torchtitan's package for ``family`` (``FAMILIES``), or one error that names the package and the pip
    command."""
    stand_in_for_newer_torch()
    try:
        return __import__(FAMILIES[family], fromlist=["_"])  # the package itself, not torchtitan's top
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "torchtitan":
            raise RlcoreError(f"trainer.backend = 'torchtitan' needs the torchtitan package, which is not installed "
                              f"here; install it with: {INSTALL}") from None
        raise RlcoreError(f"trainer.backend = 'torchtitan': torchtitan is installed but does not import here ({exc}). "
                          f"{torch_mismatch()}") from None


def stand_in_for_newer_torch() -> None:
    """Let torchtitan 0.3.0 import under torch 2.11 (the GPU image's). Its modules import
    ``torch.distributed.fsdp.DataParallelMeshDims`` (torch >= 2.12) at load time, only to annotate and hand
    on the mesh axes of its full-DTensor mode; the path rlcore takes (``apply_fsdp_to_decoder`` without
    ``dp_mesh_dims``) never builds or passes one. Where torch lacks the name, it gets a stand-in class that
    refuses to be built, naming what it stands for; a torch that has it is left alone."""
    import torch.distributed.fsdp as fsdp

    if hasattr(fsdp, "DataParallelMeshDims"):
        return

    class DataParallelMeshDims:  # the name torchtitan imports; never built on rlcore's path
        rlcore_stand_in = True

        def __init__(self, *args, **kwargs):
            raise RlcoreError(f"torchtitan's full-DTensor data parallelism needs torch >= 2.12 "
                              f"(torch.distributed.fsdp.DataParallelMeshDims); this torch is {torch.__version__}")

    fsdp.DataParallelMeshDims = DataParallelMeshDims


def torch_mismatch() -> str:
    """What to do when torchtitan is installed and fails to import: most often a torch older than it needs."""
    import torch

    return (f"This environment's torch is {torch.__version__}; torchtitan 0.3.0 was run by rlcore with torch 2.11 "
            "(on an H200, with a stand-in for the one newer torch name it imports: stand_in_for_newer_torch) and "
            "torch 2.13 (on the CPU): install one of those, or a torchtitan that supports this torch "
            f"({INSTALL} pins 0.3.0)")


def check_family(hf_config) -> None:
    """Refuse, by name, a model torchtitan does not carry or a feature its model of the family lacks."""
    family = hf_config.model_type
    if family not in FAMILIES:
        why = f" ({NOT_CARRIED[family]})" if family in NOT_CARRIED else ""
        raise RlcoreError(f"trainer.backend = 'torchtitan' trains {', '.join(FAMILIES)} models (the families "
                          f"torchtitan carries with a Hugging Face state-dict adapter that rlcore maps); this model "
                          f"is {family!r}{why}: use trainer.backend = 'fsdp'")
    problems = [f"{name} = {getattr(hf_config, name)!r}" for name, plain in (
        ("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu"), ("use_sliding_window", False))
        if getattr(hf_config, name, plain) != plain]
    rope_type = _rope(hf_config).get("rope_type", "default")
    if rope_type not in ROPE_TYPES[family]:
        problems.append(f"rope type {rope_type!r}")
    if problems:
        raise RlcoreError(f"trainer.backend = 'torchtitan': this {family} model has {', '.join(problems)}, which "
                          f"torchtitan's {family} model does not compute (no biases, SiLU, no sliding window, rope "
                          f"{' or '.join(repr(kind) for kind in ROPE_TYPES[family])}): use trainer.backend = 'fsdp'")


def _rope(hf_config) -> dict:
    """The rope settings, as transformers 5 (``rope_parameters``) or 4 (``rope_theta``, ``rope_scaling``)
    keep them."""
    parameters = dict(getattr(hf_config, "rope_parameters", None) or {})
    if not parameters:
        parameters = dict(getattr(hf_config, "rope_scaling", None) or {})
        parameters.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    if "type" in parameters and "rope_type" not in parameters:
        parameters["rope_type"] = parameters["type"]
    return parameters


def titan_config(hf_config):
    """torchtitan's model config (``Llama3Model.Config`` or ``Qwen3Model.Config``) for a Hugging Face config
    of a family it carries (``check_family`` first)."""
    check_family(hf_config)
    family = hf_config.model_type
    package = import_torchtitan(family)  # first: a missing or failing torchtitan is one error naming it
    from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config

    dim, heads = hf_config.hidden_size, hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or dim // heads
    rope = _rope(hf_config)
    theta, eps = float(rope.get("rope_theta", 10000.0)), hf_config.rms_norm_eps
    if family == "qwen3":  # Hugging Face's rotate-half rope, and an RMSNorm over each query and key head
        rope_config = CosSinRoPE.Config(dim=head_dim, max_seq_len=hf_config.max_position_embeddings, theta=theta)
        block, model, qk_norm = package.Qwen3TransformerBlock, package.Qwen3Model, RMSNorm.Config(
            normalized_shape=head_dim, eps=eps)
    else:
        scaling = {}
        if rope.get("rope_type") == "llama3":
            scaling = dict(scaling="llama", scaling_factor=float(rope["factor"]),
                           low_freq_factor=float(rope["low_freq_factor"]),
                           high_freq_factor=float(rope["high_freq_factor"]),
                           original_max_position_embeddings=int(rope["original_max_position_embeddings"]))
        rope_config = ComplexRoPE.Config(dim=head_dim, max_seq_len=hf_config.max_position_embeddings, theta=theta,
                                         **scaling)
        block, model, qk_norm = package.Llama3TransformerBlock, package.Llama3Model, None
    layers = [block.Config(
        attention_norm=RMSNorm.Config(normalized_shape=dim, eps=eps),
        ffn_norm=RMSNorm.Config(normalized_shape=dim, eps=eps),
        attention=make_gqa_config(dim=dim, n_heads=heads, n_kv_heads=kv_heads,
                                  head_dim=head_dim if head_dim != dim // heads else None,
                                  wqkv_param_init={}, wo_param_init={}, qk_norm=qk_norm,
                                  inner_attention=ScaledDotProductAttention.Config(), fuse_qkv=False, rope=rope_config),
        feed_forward=make_ffn_config(dim=dim, hidden_dim=hf_config.intermediate_size, w1_param_init={},
                                     w2w3_param_init={}),
    ) for _ in range(hf_config.num_hidden_layers)]
    vocab = hf_config.vocab_size
    return model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=bool(getattr(hf_config, "tie_word_embeddings", False)),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim, eps=eps),
        lm_head=Linear.Config(in_features=dim, out_features=vocab), layers=layers)


def state_dict_adapter(hf_config, config):
    """torchtitan's state-dict adapter of the family (Hugging Face names and layouts both ways)."""
    package = import_torchtitan(hf_config.model_type)
    adapter = package.Qwen3StateDictAdapter if hf_config.model_type == "qwen3" else package.Llama3StateDictAdapter
    return adapter(config, None)


@attrs.frozen
class TitanModel:
    """torchtitan's model of a Hugging Face folder, with what converts its weights back."""

    module: nn.Module  # torchtitan's Llama3Model or Qwen3Model, parallelised (FSDP2)
    hf_config: object  # the folder's transformers config (export, the hf engine's module)
    adapter: object  # torchtitan's state-dict adapter of the family: to_hf / from_hf


def load_titan_model(path: str, master_dtype: torch.dtype, compute_dtype: torch.dtype, platform: Platform, *,
                     reshard_after_forward: str = "default", cpu_offload: bool = False,
                     override_config: dict | None = None) -> TitanModel:
    """The folder (or embedded model) at ``path`` as torchtitan's model of its family: parameters in
    ``master_dtype``, computing in ``compute_dtype`` (FSDP2's mixed precision), sharded over every rank
    of the process group by torchtitan's FSDP2."""
    hf_model = load_causal_lm(path, master_dtype, override_config=override_config)
    hf_config = hf_model.config
    config = titan_config(hf_config)
    adapter = state_dict_adapter(hf_config, config)
    weights = adapter.from_hf(dict(hf_model.state_dict()))
    del hf_model
    with torch.device("cpu"):
        module = config.build()
    for parameter in module.parameters():  # not module.to(dtype): it would cast the complex rope caches to real
        parameter.data = parameter.data.to(master_dtype)
    missing, unexpected = module.load_state_dict(weights, strict=False)
    missing = [name for name in missing if not name.endswith("rope.cache")]
    if missing or unexpected:
        raise RlcoreError(f"torchtitan's {hf_config.model_type} model and the weights of {path} differ: missing "
                          f"{missing}, unexpected {unexpected}")
    module = parallelize(module, platform, compute_dtype, reshard_after_forward=reshard_after_forward,
                         cpu_offload=cpu_offload)
    return TitanModel(module, hf_config, adapter)


def parallelize(module: nn.Module, platform: Platform, compute_dtype: torch.dtype, *, reshard_after_forward: str,
                cpu_offload: bool) -> nn.Module:
    """torchtitan's FSDP2 sharding of a decoder (``apply_fsdp_to_decoder``, what its ``parallelize_llama``
    applies when only data parallelism is on) over every rank: parameters cast to ``compute_dtype`` for
    compute, gradients reduced in fp32.

    The mesh is rlcore's (one dimension over the process group, on the platform's device type):
    torchtitan 0.3.0's ``ParallelDims.build_mesh`` takes its device type from
    ``torchtitan.tools.utils.device_type``, which is "cuda" where no accelerator is found, and gives its
    size-1 dimensions the "fake" process-group backend, which a plain process does not register."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    import_torchtitan()
    device = local_device(platform)
    module.to(device)
    for rope in (layer.attention.rope for layer in module.layers.values()):
        rope.cache = rope.cache.to(device)  # a buffer made at build time, on the CPU
    mesh = init_device_mesh(platform.device_type, (world_size(),), mesh_dim_names=("fsdp",))
    apply_fsdp_to_decoder(module, mesh, param_dtype=compute_dtype, reduce_dtype=torch.float32, pp_enabled=False,
                          cpu_offload=cpu_offload, reshard_after_forward_policy=reshard_after_forward)
    # torchtitan switches FSDP's division of gradients off (a divide factor of 1: the ranks' gradients are
    # summed, and the loss carries the scaling; rlcore_torchtitan.actor weighs it so). FSDP2 then reduces
    # with PREMUL_SUM(1.0), which gloo (the CPU) refuses; a plain SUM is the same sum.
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.set_force_sum_reduction_for_comms(True)
    return module
