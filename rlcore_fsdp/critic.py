"""The critic (value model) on FSDP2."""

from __future__ import annotations

import torch
from torch import Tensor

from rlcore.api import (
    Batch,
    Critic,
    CriticSpec,
    Platform,
    critic_loss,
    ensure_process_group,
    explained_variance,
    load_value_model,
    resolve_dtype,
    world_size,
)
from rlcore_fsdp.batching import require
from rlcore_fsdp.forward import response_values
from rlcore_fsdp.lora import add_lora, lora_settings
from rlcore_fsdp.options import options_of
from rlcore_fsdp.sharding import shard_model
from rlcore_fsdp.trained import TrainedModel, no_grad_batches
from rlcore_fsdp.ulysses import (
    group_size,
    over_group,
    packed_attention,
    per_group,
    sequence_parallel_group,
    share_rows,
)

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
# transformers' names for a token-classification head: trained whole under LoRA (PEFT's modules_to_save)
VALUE_HEADS = ("score", "classifier")


class FsdpCritic(TrainedModel, Critic):
    """``critic.model.path`` (default ``model.path``) with a scalar value head, fp32 master weights,
    computing in ``model.dtype``. Mini-batch size and epochs default to the actor's."""

    role = "critic"

    def __init__(self, spec: CriticSpec, platform: Platform):
        ensure_process_group(platform)
        critic = spec.critic
        model = load_value_model(spec.path, torch.float32, trust_remote_code=spec.model.trust_remote_code,
                                 gradient_checkpointing=critic.model.enable_gradient_checkpointing, seed=spec.seed)
        self.lora = lora_settings(critic.model)
        if self.lora:
            add_lora(model, critic.model, seed=spec.seed, keep_trainable=VALUE_HEADS, section="critic.model")
            self.base_model = spec.path
        self.sp_group = sequence_parallel_group(critic.ulysses_sequence_parallel_size,
                                                "critic.ulysses_sequence_parallel_size")
        packed_attention(model, spec.model.use_remove_padding, self.sp_group, "critic", platform)
        compute_dtype = resolve_dtype(spec.model.dtype, platform)
        fsdp = options_of(spec, "critic.fsdp")
        module = shard_model(model, platform, fsdp, compute_dtype)
        super().__init__(module, spec, fsdp, platform, compute_dtype)

    def compute_values(self, batch: Batch) -> Batch:
        require(batch, MODEL_INPUTS, "critic.compute_values")

        def compute(micro: Batch) -> dict[str, Tensor]:
            values = response_values(self.module, micro, self.device, packed=self.packed, sp_group=self.sp_group)
            (mask,) = self.to_device(micro, "response_mask")
            return {"values": torch.where(mask.bool(), values, 0.0)}

        plan = per_group(self.spec.values_plan, self.sp_group)
        return over_group(batch, self.sp_group, self.device, lambda rows: no_grad_batches(
            self.module, rows, plan.rows, plan.token_budget, compute, packed=self.packed, budget_name=plan.budget_name))

    def update(self, batch: Batch) -> dict[str, float]:
        require(batch, MODEL_INPUTS + ("values", "returns"), "critic.update")
        spec = self.spec
        plan = per_group(spec.update_plan, self.sp_group)
        explained = explained_variance(batch["values"], batch["returns"], batch["response_mask"])
        batch, _ = share_rows(batch, self.sp_group, self.device)  # the SP group trains on its rows together
        metrics = self.run_updates(
            batch,
            mini_rows=spec.mini_batch_rows(world_size()) * group_size(self.sp_group),
            epochs=spec.epochs, shuffle=spec.shuffle, seed=spec.seed + self.schedule.step,
            micro_rows=plan.rows, token_budget=plan.token_budget, budget_name=plan.budget_name,
            loss_agg_mode=spec.loss_agg_mode, micro_loss=self._micro_loss)
        metrics["critic/vf_explained_var"] = explained
        return metrics

    def _micro_loss(self, micro: Batch) -> tuple[Tensor, dict[str, Tensor | float]]:
        vpreds = response_values(self.module, micro, self.device, packed=self.packed, sp_group=self.sp_group)
        mask, returns, values = self.to_device(micro, "response_mask", "returns", "values")
        return critic_loss(vpreds, returns, values, mask, self.spec.critic, norm_length=self.spec.norm_length)
