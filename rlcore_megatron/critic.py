"""The critic (value model) on megatron-core: the GPT model with a scalar value head."""

from __future__ import annotations

import torch
from torch import Tensor

from rlcore.api import (
    Batch,
    Critic,
    CriticSpec,
    Platform,
    critic_loss,
    explained_variance,
)
from rlcore_megatron.compute import Micro, response_values
from rlcore_megatron.trained import TrainedModel, require

MODEL_INPUTS = ("input_ids", "attention_mask", "responses", "response_mask")  # what the values need


class MegatronCritic(TrainedModel, Critic):
    """``critic.model.path`` (default ``model.path``) as a ``GPTModel`` whose output layer is a
    scalar head (transformers' token-classification ``score``: kept from a saved critic, new from a
    causal LM, initialised from ``trainer.seed``). Mini-batch size and epochs default to the actor's."""

    role = "critic"

    def __init__(self, spec: CriticSpec, platform: Platform):
        super().__init__(spec, platform, section="critic.megatron", value_head=True,
                         gradient_checkpointing=spec.critic.model.enable_gradient_checkpointing)

    def compute_values(self, batch: Batch) -> Batch:
        require(batch, MODEL_INPUTS, "critic.compute_values")

        def compute(micro: Micro, output: Tensor) -> dict[str, Tensor]:
            return {"values": response_values(output, micro)}

        plan = self.spec.values_plan
        values = self.forward_rows(batch, ("values",), plan.rows, plan.token_budget, plan.budget_name, compute)
        return Batch({"values": torch.where(batch["response_mask"].bool(), values["values"], 0.0)})

    def update(self, batch: Batch) -> dict[str, float]:
        require(batch, MODEL_INPUTS + ("values", "returns"), "critic.update")
        spec, plan = self.spec, self.spec.update_plan
        explained = explained_variance(batch["values"], batch["returns"], batch["response_mask"])
        metrics = self.run_updates(
            batch, extra_keys=("response_mask", "returns", "values"),
            epochs=spec.epochs, shuffle=spec.shuffle, seed=spec.seed + self.schedule.step, micro_rows=plan.rows,
            token_budget=plan.token_budget, budget_name=plan.budget_name, loss_agg_mode=spec.loss_agg_mode,
            micro_loss=self._micro_loss)
        metrics["critic/vf_explained_var"] = explained
        return metrics

    def _micro_loss(self, micro: Micro, output: Tensor) -> tuple[Tensor, dict[str, Tensor | float]]:
        vpreds = response_values(output, micro)
        mask, returns, values = self.to_device(micro, "response_mask", "returns", "values")
        return critic_loss(vpreds, returns, values, mask, self.spec.critic, norm_length=self.spec.norm_length)
