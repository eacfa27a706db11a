"""The actor and the reference on VeOmni's model: rlcore's fsdp roles with the model built, and over
several ranks sharded, by VeOmni (``rlcore_veomni.model``). Everything after that (packed or padded
forwards, losses, the update loop, weight sync, checkpoints) is the fsdp backend's."""

from __future__ import annotations

import torch
from torch import nn

from rlcore.api import ActorSpec, ModelConfig, Platform, ReferenceSpec, world_size
from rlcore_fsdp.actor import FsdpActor, FsdpReference
from rlcore_fsdp.options import options_of as fsdp_options_of
from rlcore_fsdp.sharding import shard_model
from rlcore_veomni.model import build_model, parallelize
from rlcore_veomni.options import options_of


class VeomniActor(FsdpActor):
    """The policy: ``model.path`` as VeOmni builds it, in fp32 (AdamW's master copy), computing in
    ``model.dtype``; sharded by VeOmni's FSDP2 over several ranks, by rlcore's on one."""

    def __init__(self, spec: ActorSpec, platform: Platform):
        self.veomni = options_of(spec, "actor.veomni")
        self.platform = platform
        super().__init__(spec, platform)

    def load_model(self, path: str, dtype: torch.dtype, model: ModelConfig, override_config: dict) -> nn.Module:
        built = build_model(path, dtype, self.veomni, self.platform, override_config=override_config,
                            trust_remote_code=model.trust_remote_code)
        if model.enable_gradient_checkpointing and world_size() == 1:  # over several ranks VeOmni's parallelize does
            built.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return built

    def shard(self, model: nn.Module, platform: Platform, spec: ActorSpec, compute_dtype: torch.dtype) -> nn.Module:
        if world_size() == 1:
            return shard_model(model, platform, self.fsdp, compute_dtype)
        return parallelize(model, spec.path, compute_dtype, self.veomni,
                           reshard_after_forward=self.fsdp.reshard_after_forward,
                           gradient_checkpointing=spec.model.enable_gradient_checkpointing)


class VeomniReference(FsdpReference):
    """The frozen initial policy (or a distillation teacher) as VeOmni builds it, in ``model.dtype``, no
    optimizer; sharded as the actor is."""

    def __init__(self, spec: ReferenceSpec, platform: Platform):
        self.veomni = options_of(spec, "ref.veomni")
        self.platform = platform
        super().__init__(spec, platform)

    def load_model(self, path: str, dtype: torch.dtype, model: ModelConfig, override_config: dict) -> nn.Module:
        return build_model(path, dtype, self.veomni, self.platform, override_config=override_config,
                           trust_remote_code=model.trust_remote_code)

    def shard(self, model: nn.Module, platform: Platform, spec: ReferenceSpec, dtype: torch.dtype) -> nn.Module:
        if world_size() == 1:
            return shard_model(model, platform, fsdp_options_of(spec, "ref.fsdp"), dtype)
        module = parallelize(model, spec.path, dtype, self.veomni,
                             reshard_after_forward=fsdp_options_of(spec, "ref.fsdp").reshard_after_forward,
                             gradient_checkpointing=False)
        return module.requires_grad_(False)
