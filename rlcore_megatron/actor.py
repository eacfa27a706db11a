"""The actor (policy) and the reference on megatron-core."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import Tensor, nn

from rlcore.api import (
    Actor,
    ActorSpec,
    Batch,
    Platform,
    Reference,
    ReferenceSpec,
    RlcoreError,
    entropy_in_loss,
    micro_batch_actor_loss,
    policy_tokenizer,
    resolve_model_path,
    token_log_probs,
    weight_buckets,
)
from rlcore_megatron.compute import Micro, response_logits
from rlcore_megatron.model import hf_weight_stream
from rlcore_megatron.trained import (
    MODEL_INPUTS,
    MegatronModel,
    TrainedModel,
    require,
)
from rlcore_megatron.weights import module_slot

GENERATION_BUCKET_BYTES = 256 * 2**20


def _temperature(temperature: float) -> float:
    return temperature if temperature > 0 else 1.0


class MegatronActor(TrainedModel, Actor):
    """The policy as a megatron-core ``GPTModel`` (local layer spec), split by
    ``[actor.megatron]`` tensor/pipeline parallel sizes, trained with Megatron's DDP and optimizer.

    Megatron's module is no Hugging Face model, so the ``hf`` engine gets a Hugging Face copy:
    ``generation_module()`` builds one on this rank's device (once) and loads the actor's current
    weights into it each time it is lent (a full copy of the weights per rank). Engines that take
    weights (``vllm``) get them from ``weights_for_rollout``."""

    role = "actor"

    def __init__(self, spec: ActorSpec, platform: Platform):
        super().__init__(spec, platform, section="actor.megatron",
                         gradient_checkpointing=spec.model.enable_gradient_checkpointing)
        self.distillation = spec.algorithms.distillation
        self.temperature = _temperature(spec.temperature)
        self.replay_mode = spec.actor.router_replay  # "off", "R2" or "R3"
        if self.replay_mode != "off":
            from rlcore_megatron.routing import RoutingReplay

            if self.shape.experts is None:
                raise RlcoreError(f"actor.router_replay = {self.replay_mode!r} replays a mixture of experts' "
                                  f"routing; the model at {self.path} has no experts: set it to 'off'")
            self.router_replay = RoutingReplay(self.gpt, self.shape.num_layers, self.shape.experts.top_k)
        self._hf_copy: nn.Module | None = None

    def _log_probs(self, micro: Micro, logits: Tensor, with_entropy: bool, entropy_grad: bool = False):
        full = response_logits(logits, micro, self.shape.vocab_size)
        return token_log_probs(full, micro.responses.to(full.device), self.temperature, with_entropy=with_entropy,
                               entropy_grad=entropy_grad)

    # -- log-probs -------------------------------------------------------------------------------
    def compute_log_prob(self, batch: Batch) -> Batch:
        require(batch, MODEL_INPUTS, "actor.compute_log_prob")

        def compute(micro: Micro, logits: Tensor) -> dict[str, Tensor]:
            log_probs, entropy = self._log_probs(micro, logits, True)
            return {"old_log_probs": log_probs, "entropys": entropy}

        plan = self.spec.log_prob_plan
        return self.forward_rows(batch, ("old_log_probs", "entropys"), plan.rows, plan.token_budget,
                                 plan.budget_name, compute, routing=self._old_pass_routing(batch))

    def _old_pass_routing(self, batch: Batch) -> str:
        """R2: the old log-prob pass records its routing (returned as ``routed_experts``); R3: it
        replays the engine's, which the rows must carry."""
        if self.replay_mode == "R2":
            return "record"
        if self.replay_mode == "R3":
            require(batch, ("routed_experts",), "actor.compute_log_prob with actor.router_replay = 'R3' "
                                                "(the rollout engine's routed_experts)")
            return "replay"
        return "off"

    # -- update ----------------------------------------------------------------------------------
    def update(self, batch: Batch) -> dict[str, float]:
        spec, plan = self.spec, self.spec.update_plan
        actor = spec.actor
        extra = ("response_mask", "advantages") + (("ref_log_prob",) if actor.use_kl_loss or self.distillation else ())
        require(batch, MODEL_INPUTS + extra, "actor.update")
        if "old_log_probs" in batch:  # else on-policy: the update's own log-probs (RolePlan.old_log_prob_pass)
            extra += ("old_log_probs",)
        elif spec.algorithms.rollout_correction is not None:  # each micro-batch weighed against its own log-probs
            extra += ("rollout_log_probs",)
        if self.replay_mode == "R3":
            require(batch, ("routed_experts",), "actor.update with actor.router_replay = 'R3'")
        if self.replay_mode != "off" and "routed_experts" in batch:
            # R2 without an old log-prob pass (on-policy) has nothing recorded: the update's router
            # chooses, as that pass would have
            extra += ("routed_experts",)
        metrics = self.run_updates(
            batch, extra_keys=extra, epochs=spec.epochs, shuffle=spec.shuffle, seed=spec.seed + self.schedule.step,
            micro_rows=plan.rows, token_budget=plan.token_budget, budget_name=plan.budget_name,
            loss_agg_mode=spec.loss_agg_mode, micro_loss=self._micro_loss)
        if actor.use_kl_loss:
            metrics["actor/kl_coef"] = actor.kl_loss_coef
        return metrics

    def _micro_loss(self, micro: Micro, logits: Tensor) -> tuple[Tensor, dict[str, Tensor | float]]:
        """Policy loss - entropy_coeff * entropy + kl_loss_coef * KL(policy || reference)."""
        log_prob, entropy = self._log_probs(micro, logits, True, entropy_grad=entropy_in_loss(self.spec.actor))
        return micro_batch_actor_loss(log_prob, entropy, partial(self.to_device, micro), self.spec,
                                      on_policy="old_log_probs" not in micro.extras)

    # -- weights ---------------------------------------------------------------------------------
    def weights_for_rollout(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full parameters with Hugging Face names in the compute dtype, on this rank's device,
        gathered over tensor- and pipeline-parallel ranks parameter by parameter as the engine takes
        the buckets (every rank takes part); offloaded parameters stay on the device until the last
        bucket is taken."""
        with self.offload.resident():
            yield from weight_buckets(hf_weight_stream(self.gpt, self.shape, self.layout, self.compute_dtype),
                                      bucket_bytes)

    def generation_group(self):
        """The ranks of one model replica (tensor, pipeline and context parallel): they train on the
        union of their shares, so they generate it together too (each with its full Hugging Face
        copy, alike), as one data-parallel rank."""
        import torch.distributed as dist

        from rlcore_megatron.model import model_replica_group

        group = model_replica_group()
        return group if dist.get_world_size(group) > 1 else None

    @contextmanager
    def generation_module(self):
        """A Hugging Face model holding the actor's current weights, in eval mode without gradients."""
        model = self._generation_copy()
        params = dict(model.named_parameters())
        with torch.no_grad():
            for bucket in self.weights_for_rollout(GENERATION_BUCKET_BYTES):
                for name, tensor in bucket:
                    slot = module_slot(params, name, tensor)
                    if slot is None:
                        raise RlcoreError(f"the Hugging Face copy of the actor has no parameter {name!r}")
                    slot[0].copy_(slot[1])
            yield model

    def _generation_copy(self) -> nn.Module:
        if self._hf_copy is None:
            from transformers import AutoModelForCausalLM, GenerationConfig

            with torch.device(self.device):
                model = AutoModelForCausalLM.from_config(self.hf_config, dtype=self.compute_dtype)
            try:
                model.generation_config = GenerationConfig.from_pretrained(resolve_model_path(self.path))
            except OSError:
                pass  # no generation_config.json: the one derived from the model config stays
            model.requires_grad_(False)
            self._hf_copy = model.eval()
        return self._hf_copy

    def _tokenizer(self):
        return policy_tokenizer(self.spec.model)


class MegatronReference(MegatronModel, Reference):
    """The frozen initial policy (``model.path``), or the distillation teacher (``spec.path``), in
    ``model.dtype``, no optimizer."""

    def __init__(self, spec: ReferenceSpec, platform: Platform):
        super().__init__(spec, platform, section="ref.megatron")
        self.gpt.requires_grad_(False)
        self.setup_offload("ref.megatron")
        self.temperature = _temperature(spec.temperature)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        require(batch, MODEL_INPUTS, "reference.compute_ref_log_prob")

        def compute(micro: Micro, logits: Tensor) -> dict[str, Tensor]:
            full = response_logits(logits, micro, self.shape.vocab_size)
            log_probs, _ = token_log_probs(full, micro.responses.to(full.device), self.temperature,
                                           with_entropy=False)
            return {"ref_log_prob": log_probs}

        plan = self.spec.log_prob_plan
        return self.forward_rows(batch, ("ref_log_prob",), plan.rows, plan.token_budget, plan.budget_name, compute)
