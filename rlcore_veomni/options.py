"""``[actor.veomni]`` and ``[ref.veomni]``: the veomni backend's own settings, handed to VeOmni's
``OpsImplementationConfig`` (which kernels its model code runs) and ``build_parallelize_model``."""

from __future__ import annotations

import attrs

from rlcore.api import TrainingSpec, setting

SECTIONS = ("actor.veomni", "ref.veomni")
ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flash_attention_4", "flex_attention")


@attrs.frozen
class VeomniOptions:
    attn_implementation: str = setting(
        "sdpa", choices=ATTENTION,
        doc="VeOmni's attention for padded rows (model.use_remove_padding = false); packed rows use rlcore's "
            "packed attention, as on the fsdp backend. flash_attention_* need the flash-attn packages")
    kernels: str = setting(
        "eager", choices=("eager", "liger_kernel"),
        doc="VeOmni's kernels for RMSNorm, SwiGLU and rotary embeddings: PyTorch's ('eager'), or Liger's "
            "('liger_kernel', GPU only, needs the liger-kernel package)")
    enable_fsdp_offload: bool = setting(
        False, doc="VeOmni's enable_fsdp_offload: parameters, gradients and optimizer states on the CPU (FSDP2's "
                   "CPUOffloadPolicy), on more than one rank")


def options_of(spec: TrainingSpec, section: str) -> VeomniOptions:
    """The options of ``section`` ("actor.veomni", ...) in a role's spec; the defaults for a job built in
    code rather than loaded (it carries no plugin tables)."""
    return spec.section(section, VeomniOptions())
