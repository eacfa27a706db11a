"""A Hugging Face model folder as VeOmni builds it: its config (rlcore's overrides applied, dropout off)
handed to ``veomni.models.build_foundation_model`` with the kernels ``[actor.veomni]`` chooses, and, over
several ranks, sharded by ``veomni.distributed.torch_parallelize.build_parallelize_model`` (FSDP2, its
mixed-precision policy and its weight loading onto the shards).

VeOmni's own parallelisation leaves a single rank unsharded and then wants the model built on the
accelerator; rlcore shards a single rank's model with its own FSDP2 of one (``rlcore_fsdp.sharding``),
so that one rank computes in ``model.dtype`` over fp32 master weights exactly as several ranks do.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from rlcore.api import Platform, RlcoreError, load_model_config, resolve_model_path, world_size
from rlcore_veomni.options import VeomniOptions

INSTALL = "pip install 'rlcore[veomni]'  (veomni==0.1.12, which was generated against transformers 5.9.0)"
# Hugging Face model_type -> VeOmni's patched model package that rlcore checked (tests/veomni)
FAMILIES = {"llama": "veomni.models.transformers.llama", "qwen2": "veomni.models.transformers.qwen2",
            "qwen3": "veomni.models.transformers.qwen3", "qwen3_moe": "veomni.models.transformers.qwen3_moe",
            "deepseek_v3": "veomni.models.transformers.deepseek_v3"}
# why the other families of rlcore's family matrix (tests/families.py) are refused
NOT_CARRIED = {
    "gemma2": "VeOmni 0.1.12 has no Gemma 2 model code (it has Gemma 3)",
    "mistral": "VeOmni 0.1.12 has no Mistral model code",
    "phi3": "VeOmni 0.1.12 has no Phi-3 model code",
}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def import_veomni():
    """The ``veomni`` package, or one error that names the package and the pip command."""
    try:
        import veomni
        from veomni.models import auto  # noqa: F401 - the builders below; fails where veomni's imports do
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "veomni":
            raise RlcoreError(f"trainer.backend = 'veomni' needs the veomni package, which is not installed here; "
                              f"install it with: {INSTALL}") from None
        raise RlcoreError(f"trainer.backend = 'veomni': veomni is installed but does not import here ({exc}); "
                          f"{INSTALL}") from None
    return veomni


def check_family(config, path: str) -> None:
    """Refuse, by name, a model family this backend does not take (``FAMILIES``)."""
    model_type = getattr(config, "model_type", None)
    if model_type in FAMILIES:
        return
    why = NOT_CARRIED.get(model_type, "it is not among the families rlcore checked on VeOmni")
    raise RlcoreError(f"trainer.backend = 'veomni': model.path = {path!r} is model_type {model_type!r}: {why}. "
                      f"It takes {', '.join(sorted(FAMILIES))}; use trainer.backend = 'fsdp' for the others")


def ops_config(options: VeomniOptions):
    """VeOmni's ``OpsImplementationConfig``: ``options.attn_implementation`` for attention, ``options.kernels``
    for the norms, SwiGLU and rotary embeddings, PyTorch's own code for everything else (its fused
    cross-entropy is never called: rlcore computes log-probs from the logits)."""
    from veomni.arguments import OpsImplementationConfig

    fields = {field.name for field in dataclasses.fields(OpsImplementationConfig)}
    chosen = {name: "eager" for name in fields if name.endswith("_implementation")}
    chosen |= {name: options.kernels for name in ("rms_norm_implementation", "swiglu_mlp_implementation",
                                                  "rotary_pos_emb_implementation") if name in fields}
    chosen["attn_implementation"] = options.attn_implementation
    if "qat_implementation" in fields:
        chosen["qat_implementation"] = "none"
    return OpsImplementationConfig(**chosen)


def ensure_parallel_state(platform: Platform) -> None:
    """VeOmni's parallel state for this process: every rank one data-parallel shard (FSDP2), nothing else."""
    from veomni.distributed import parallel_state

    if not parallel_state.is_parallel_state_initialized():
        ranks = world_size()
        parallel_state.init_parallel_state(dp_size=ranks, dp_shard_size=ranks, dp_mode="fsdp2",
                                           device_type=platform.device_type)


def build_model(path: str, dtype: torch.dtype, options: VeomniOptions, platform: Platform, *,
                override_config: dict, trust_remote_code: bool) -> nn.Module:
    """The model at ``path`` built by VeOmni in ``dtype``: on the CPU for one rank, on the meta device for
    several (``shard`` loads each rank's part)."""
    import_veomni()
    from veomni.models.auto import build_foundation_model

    resolved = resolve_model_path(path)
    config = load_model_config(resolved, override_config, trust_remote_code=trust_remote_code)
    check_family(config, path)
    ensure_parallel_state(platform)
    return build_foundation_model(config_path=config, weights_path=resolved, torch_dtype=DTYPE_NAMES[dtype],
                                  init_device="meta" if world_size() > 1 else "cpu",
                                  ops_implementation=ops_config(options))


def parallelize(model: nn.Module, path: str, compute_dtype: torch.dtype, options: VeomniOptions, *,
                reshard_after_forward: bool, gradient_checkpointing: bool) -> nn.Module:
    """``model`` (built on the meta device) sharded by VeOmni's FSDP2 over every rank, each rank's part of
    the weights loaded from ``path``; computing in ``compute_dtype``, gradients reduced in fp32."""
    from veomni.arguments import MixedPrecisionConfig
    from veomni.distributed.torch_parallelize import build_parallelize_model

    stored = next(model.parameters()).dtype
    mixed = MixedPrecisionConfig(enable=compute_dtype != stored, param_dtype=DTYPE_NAMES[compute_dtype],
                                 reduce_dtype="float32")
    return build_parallelize_model(
        model, weights_path=resolve_model_path(path), init_device="meta", mixed_precision=mixed,
        enable_reshard_after_forward=reshard_after_forward, enable_gradient_checkpointing=gradient_checkpointing,
        enable_fsdp_offload=options.enable_fsdp_offload,
        basic_modules=list(getattr(model, "_no_split_modules", None) or []))
