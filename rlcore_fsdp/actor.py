"""The actor (policy) and the reference on FSDP2."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from functools import partial

import torch
from torch import Tensor, nn

from rlcore.api import (
    TOP_K_COLUMNS,
    Actor,
    ActorSpec,
    Batch,
    MicroBatchPlan,
    ModelConfig,
    ModelRouting,
    Platform,
    Reference,
    ReferenceSpec,
    RlcoreError,
    ensure_process_group,
    entropy_in_loss,
    load_causal_lm,
    policy_tokenizer,
    local_device,
    micro_batch_actor_loss,
    column_of,
    recorded_tokens,
    resolve_dtype,
    tokens_of,
    world_size,
)
from rlcore_fsdp.batching import require
from rlcore_fsdp.forward import (
    log_probs_and_entropy,
    sampling_temperature,
    student_log_probs_at_teacher_top_k,
    teacher_log_probs_and_top_k,
)
from rlcore_fsdp.lora import adapters_disabled, add_lora, load_adapter, lora_settings, with_adapter_settings
from rlcore_fsdp.options import options_of
from rlcore_fsdp.sharding import AdapterGather, compile_layers, gathered_for_inference, parameter_buckets, shard_model
from rlcore_fsdp.trained import TrainedModel, no_grad_batches
from rlcore_fsdp.ulysses import (
    gathered_routing,
    group_size,
    local_routing,
    over_group,
    packed_attention,
    per_group,
    sequence_parallel_group,
    share_rows,
)

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses")
ROUTED_EXPERTS = "routed_experts"


VISION_TOWERS = ("visual", "vision_tower", "vision_model")  # Qwen2-VL's and Qwen2.5-VL's; LLaVA's; others'


def vision_tower(model: nn.Module, path: str) -> nn.Module:
    """The image encoder of a vision-language model (for actor.freeze_vision_tower)."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in VISION_TOWERS:
            return module
    raise RlcoreError(f"actor.freeze_vision_tower: the model {path!r} ({type(model).__name__}) has no vision tower "
                      f"(a module named {', '.join(VISION_TOWERS)}); it is for vision-language models")


class FsdpActor(TrainedModel, Actor):
    """The policy: ``model.path`` loaded in fp32 (the master copy AdamW updates), computing in
    ``model.dtype``, sharded with FSDP2 over the data-parallel ranks. With ``model.lora_rank`` only
    LoRA adapters train (``rlcore_fsdp.lora``).

    ``generation_module()`` lends the sharded module itself to a colocated engine (``hf``)."""

    role = "actor"

    def __init__(self, spec: ActorSpec, platform: Platform):
        ensure_process_group(platform)
        model_settings = spec.model
        compute_dtype = resolve_dtype(model_settings.dtype, platform)
        model = self.load_model(spec.path, torch.float32, spec.model, spec.model.override_config)
        if spec.actor.freeze_vision_tower:
            vision_tower(model, spec.path).requires_grad_(False)
        model_config = with_adapter_settings(model_settings)
        self.lora = lora_settings(model_config)
        if self.lora:
            add_lora(model, model_config, seed=spec.seed)
            if model_config.lora_adapter_path:
                load_adapter(model, model_config.lora_adapter_path)
            self.base_model = spec.path
        self.sp_group = sequence_parallel_group(spec.actor.ulysses_sequence_parallel_size,
                                                "actor.ulysses_sequence_parallel_size")
        packed_attention(model, model_settings.use_remove_padding, self.sp_group, "actor", platform)
        self.routing = self._router_replay(model, spec)
        if spec.actor.use_torch_compile:
            compile_layers(model)
        self.fsdp = options_of(spec, "actor.fsdp")
        module = self.shard(model, platform, spec, compute_dtype)
        super().__init__(module, spec, self.fsdp, platform, compute_dtype)
        self.distillation = spec.algorithms.distillation
        self.temperature = sampling_temperature(spec.temperature)
        self._adapter_gather = None  # adapter_for_rollout's, built at the first sync

    # -- the model: what a backend built on this one (rlcore_veomni) replaces ---------------------
    def load_model(self, path: str, dtype: torch.dtype, model: ModelConfig, override_config: dict) -> nn.Module:
        """The model at ``path`` on the CPU in ``dtype`` (transformers' class), dropout off; gradient
        checkpointing as ``model`` says."""
        return load_causal_lm(path, dtype, trust_remote_code=model.trust_remote_code,
                              gradient_checkpointing=model.enable_gradient_checkpointing,
                              override_config=override_config)

    def shard(self, model: nn.Module, platform: Platform, spec: ActorSpec, compute_dtype: torch.dtype) -> nn.Module:
        """``model`` sharded over the ranks, computing in ``compute_dtype`` (``[actor.fsdp]``)."""
        return shard_model(model, platform, self.fsdp, compute_dtype)

    # -- router replay ---------------------------------------------------------------------------
    def _router_replay(self, model: nn.Module, spec: ActorSpec) -> ModelRouting | None:
        """actor.router_replay: hooks on the model's routers (rlcore.models.routing)."""
        return None if spec.actor.router_replay == "off" else ModelRouting(model)

    def _replaying(self, micro: Batch) -> AbstractContextManager:
        """Routes ``micro``'s forwards as its ``routed_experts`` column says (nothing without router replay);
        under Ulysses each rank replays its piece of the packed row."""
        if self.routing is None:
            return nullcontext()
        tokens = tokens_of(micro[ROUTED_EXPERTS], micro["attention_mask"], self.packed).to(self.device)
        return self.routing.replaying(tokens if self.sp_group is None else local_routing(tokens, self.sp_group))

    def _recorded_column(self, records: list[list[Tensor]], micro: Batch) -> Tensor:
        """The (B, P+R, L, K) column of the forward ``records`` holds (under Ulysses, every rank's piece)."""
        mask = micro["attention_mask"].to(self.device)
        tokens = recorded_tokens(records)
        if self.sp_group is not None:
            tokens = gathered_routing(tokens, int(mask.sum()), self.sp_group)
        return column_of(tokens, mask, self.packed)

    # -- log-probs -------------------------------------------------------------------------------
    def compute_log_prob(self, batch: Batch) -> Batch:
        """``old_log_probs`` and ``entropys`` (B, R); with router replay R2 also ``routed_experts``
        (B, P+R, L, K), the routing of this pass; under R3 this pass routes as the batch's column."""
        replay = self.spec.actor.router_replay
        require(batch, MODEL_INPUTS + ((ROUTED_EXPERTS,) if replay == "R3" else ()), "actor.compute_log_prob")

        with_squares = self.spec.actor.calculate_sum_pi_squared

        def forward(micro: Batch) -> dict[str, Tensor]:
            log_probs, entropy, squares = log_probs_and_entropy(
                self.module, micro, self.device, self.temperature, True, packed=self.packed, sp_group=self.sp_group,
                with_sum_pi_squared=with_squares)
            return {"old_log_probs": log_probs, "entropys": entropy} | ({"sum_pi_squared": squares} if with_squares
                                                                          else {})

        def compute(micro: Batch) -> dict[str, Tensor]:
            if replay != "R2":
                with self._replaying(micro) if replay == "R3" else nullcontext():
                    return forward(micro)
            with self.routing.recording() as records:
                outputs = forward(micro)
            return outputs | {ROUTED_EXPERTS: self._recorded_column(records, micro)}

        plan = per_group(self.spec.log_prob_plan, self.sp_group)
        return over_group(batch, self.sp_group, self.device, lambda rows: no_grad_batches(
            self.module, rows, plan.rows, plan.token_budget, compute, packed=self.packed, budget_name=plan.budget_name))

    # -- update ----------------------------------------------------------------------------------
    def update(self, batch: Batch) -> dict[str, float]:
        spec, plan = self.spec, per_group(self.spec.update_plan, self.sp_group)
        actor = spec.actor
        require(batch, MODEL_INPUTS + ("response_mask", "advantages")
                + (("ref_log_prob",) if actor.use_kl_loss or self.distillation else ())
                + (TOP_K_COLUMNS if self.distillation and self.distillation.top_k else ())
                + ((ROUTED_EXPERTS,) if self.routing else ()), "actor.update")
        batch, _ = share_rows(batch, self.sp_group, self.device)  # the SP group trains on its rows together
        metrics = self.run_updates(
            batch,
            mini_rows=spec.mini_batch_rows(world_size()) * group_size(self.sp_group),
            epochs=spec.epochs, shuffle=spec.shuffle, seed=spec.seed + self.schedule.step,
            micro_rows=plan.rows, token_budget=plan.token_budget, budget_name=plan.budget_name,
            loss_agg_mode=spec.loss_agg_mode, micro_loss=self._micro_loss, micro_context=self._replaying)
        if actor.use_kl_loss:
            metrics["actor/kl_coef"] = actor.kl_loss_coef
        return metrics

    def _micro_loss(self, micro: Batch) -> tuple[Tensor, dict[str, Tensor | float]]:
        """Policy loss - entropy_coeff * entropy + kl_loss_coef * KL(policy || reference), and the
        distillation term; under the top-k loss the forward also takes the log-probs at the teacher's ids."""
        entropy_grad, student = entropy_in_loss(self.spec.actor), None
        if self.distillation and self.distillation.top_k:
            log_prob, entropy, student = student_log_probs_at_teacher_top_k(
                self.module, micro, self.device, self.temperature, micro["ref_topk_ids"], entropy_grad=entropy_grad,
                packed=self.packed, sp_group=self.sp_group)
        else:
            log_prob, entropy, _ = log_probs_and_entropy(self.module, micro, self.device, self.temperature, True,
                                                         entropy_grad=entropy_grad, packed=self.packed,
                                                         sp_group=self.sp_group)
        return micro_batch_actor_loss(log_prob, entropy, partial(self.to_device, micro), self.spec,
                                      on_policy="old_log_probs" not in micro, student_top_k=student)

    def reference_view(self) -> Reference | None:
        return LoraBaseReference(self) if self.lora else None

    # -- weights ---------------------------------------------------------------------------------
    def weights_for_rollout(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full parameters in the compute dtype, on this rank's device, gathered bucket by bucket as
        the engine takes them (every rank takes part)."""
        return parameter_buckets(self.module, bucket_bytes, self.compute_dtype, self.device)

    def adapter_for_rollout(self) -> tuple[dict, dict[str, torch.Tensor]] | None:
        """The adapters whole, in the compute dtype on this rank's device, as PEFT names them."""
        if not self.lora:
            return None
        if self._adapter_gather is None:  # the parameters, their PEFT names and config: found once
            self._adapter_gather = AdapterGather(self.module, self.lora, self.spec.path,
                                                 dtype=self.compute_dtype, device=self.device)
        return self._adapter_gather()

    def generation_module(self) -> AbstractContextManager[nn.Module]:
        return gathered_for_inference(self.module, self.fsdp.reshard_after_forward, self.device)

    def _tokenizer(self):
        return policy_tokenizer(self.spec.model)


class FsdpReference(Reference):
    """The frozen initial policy (``model.path``), or the distillation teacher (``spec.path``),
    loaded directly in ``model.dtype``, sharded, no optimizer."""

    def __init__(self, spec: ReferenceSpec, platform: Platform):
        ensure_process_group(platform)
        self.spec = spec
        self.device = local_device(platform)
        dtype = resolve_dtype(spec.model.dtype, platform)
        model = self.load_model(spec.path, dtype, spec.model, spec.override_config)
        model.requires_grad_(False)
        self.packed = spec.model.use_remove_padding
        self.sp_group = sequence_parallel_group(spec.sequence_parallel_size, "ref.ulysses_sequence_parallel_size")
        packed_attention(model, self.packed, self.sp_group, "ref", platform)
        if spec.use_torch_compile:  # verl's ref.use_torch_compile follows the actor's
            compile_layers(model)
        self.module = self.shard(model, platform, spec, dtype)
        self.module.eval()
        self.temperature = sampling_temperature(spec.temperature)

    def load_model(self, path: str, dtype: torch.dtype, model: ModelConfig, override_config: dict) -> nn.Module:
        """The model at ``path`` on the CPU in ``dtype`` (transformers' class), dropout off."""
        return load_causal_lm(path, dtype, trust_remote_code=model.trust_remote_code, override_config=override_config)

    def shard(self, model: nn.Module, platform: Platform, spec: ReferenceSpec, dtype: torch.dtype) -> nn.Module:
        """``model`` sharded over the ranks, in ``dtype`` (``[ref.fsdp]``)."""
        return shard_model(model, platform, options_of(spec, "ref.fsdp"), dtype)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """``ref_log_prob`` (B, R); as a distillation teacher under the top-k loss, also ``ref_topk_ids`` and
        ``ref_topk_log_probs`` (B, R, K)."""
        return reference_log_probs(self.module, batch, self.spec.log_prob_plan, self.device, self.temperature,
                                   self.packed, self.sp_group, top_k=self.spec.top_k)


class LoraBaseReference(Reference):
    """The reference of an actor that trains LoRA adapters: the actor's own module with its adapters
    switched off, which is the initial policy, without a second copy of the weights (as verl)."""

    def __init__(self, actor: FsdpActor):
        self.actor = actor

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        actor = self.actor
        with adapters_disabled(actor.module):
            return reference_log_probs(actor.module, batch, actor.spec.reference_plan, actor.device,
                                       actor.temperature, actor.packed, actor.sp_group)


def reference_log_probs(module: nn.Module, batch: Batch, plan: MicroBatchPlan, device: torch.device,
                        temperature: float, packed: bool, sp_group=None, top_k: int = 0) -> Batch:
    """``ref_log_prob`` of ``module`` over the reference's micro-batches (``plan``), without gradients; with
    ``top_k``, also its ``top_k`` most likely tokens per position (``teacher_log_probs_and_top_k``)."""
    require(batch, MODEL_INPUTS, "reference.compute_ref_log_prob")

    def compute(micro: Batch) -> dict[str, Tensor]:
        if top_k:
            return teacher_log_probs_and_top_k(module, micro, device, temperature, top_k, packed=packed,
                                               sp_group=sp_group)
        log_probs, _, _ = log_probs_and_entropy(module, micro, device, temperature, False, packed=packed,
                                                sp_group=sp_group)
        return {"ref_log_prob": log_probs}

    plan = per_group(plan, sp_group)
    return over_group(batch, sp_group, device, lambda rows: no_grad_batches(
        module, rows, plan.rows, plan.token_budget, compute, packed=packed, budget_name=plan.budget_name))

