"""The actor (policy) and the reference on torchtitan's model."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from functools import partial

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlcore.api import (
    Actor,
    ActorSpec,
    Batch,
    LrSchedule,
    MicroBatchPlan,
    Platform,
    Reference,
    ReferenceSpec,
    RlcoreError,
    ensure_process_group,
    entropy_in_loss,
    local_device,
    loss_weights,
    micro_batch_actor_loss,
    policy_tokenizer,
    read_metrics,
    resolve_dtype,
    role_metric_name,
    to_device,
    weight_buckets,
    world_size,
)
from rlcore_torchtitan.checkpoint import load_checkpoint, save_checkpoint
from rlcore_torchtitan.forward import log_probs_and_entropy
from rlcore_torchtitan.model import load_titan_model
from rlcore_torchtitan.options import options_of
from rlcore_torchtitan.weights import GenerationModule, hf_weights

MODEL_INPUTS = ("input_ids", "attention_mask", "responses")
# metrics combined as the loss is (loss_agg_mode); the others are token means
LOSS_METRICS = frozenset({"pg_loss", "entropy", "kl_loss"})


def _require(batch: Batch, keys: tuple[str, ...], where: str) -> None:
    missing = [key for key in keys if key not in batch]
    if missing:
        raise RlcoreError(f"{where}: the batch lacks {', '.join(missing)}")


def _sampling_temperature(temperature: float) -> float:
    return temperature if temperature > 0 else 1.0  # greedy (0): the plain distribution


def micro_batches(batch: Batch, plan: MicroBatchPlan) -> list[Batch]:
    """The batch in micro-batches of ``plan.rows`` rows, or in as few runs of consecutive rows as keep
    each within ``plan.token_budget`` padded tokens; with several ranks, every rank runs the most any
    rank needs (FSDP's collectives pair up forward for forward)."""
    rows = len(batch)
    if plan.rows is not None:
        count = math.ceil(rows / plan.rows)
    else:
        width = batch["attention_mask"].shape[1]
        if width > plan.token_budget:
            raise RlcoreError(f"{plan.budget_name} = {plan.token_budget}: a row of {width} tokens does not fit")
        count = math.ceil(rows / max(plan.token_budget // width, 1))
    if world_size() > 1:
        most = torch.tensor([count])
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        count = int(most)
    return [batch.select(part) for part in torch.arange(rows).tensor_split(max(count, 1))]


class TitanActor(Actor):
    """The policy: ``model.path`` as torchtitan's model of its family (Llama 3, Qwen3), parameters in fp32
    (AdamW's master copy), computing in ``model.dtype``, sharded by torchtitan's FSDP2 over the ranks.

    ``generation_module()`` lends the ``hf`` engine a transformers model holding the actor's current
    weights, converted to Hugging Face names by torchtitan's adapter (``weights_for_rollout``'s)."""

    def __init__(self, spec: ActorSpec, platform: Platform):
        if spec.model.lora_rank:
            raise RlcoreError("model.lora_rank: trainer.backend = 'torchtitan' trains every weight (no LoRA): "
                              "use trainer.backend = 'fsdp'")
        ensure_process_group(platform)
        self.spec = spec
        self.platform = platform
        self.device = local_device(platform)
        self.compute_dtype = resolve_dtype(spec.model.dtype, platform)
        options = options_of(spec, "actor.torchtitan")
        self.titan = load_titan_model(spec.path, torch.float32, self.compute_dtype, platform,
                                      reshard_after_forward=options.fsdp_reshard_after_forward,
                                      cpu_offload=options.enable_cpu_offload,
                                      override_config=spec.model.override_config)
        self.module = self.titan.module
        optim = spec.optim
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=optim.lr, betas=tuple(optim.betas),
                                           eps=optim.eps, weight_decay=optim.weight_decay)
        self.schedule = LrSchedule(optim, "actor.optim", total_steps=spec.total_steps)
        self.temperature = _sampling_temperature(spec.temperature)
        self._generation = GenerationModule(self.titan.hf_config, self.compute_dtype, self.device)

    def set_total_steps(self, total_steps: int) -> None:
        self.schedule.total_steps = total_steps

    # -- log-probs -------------------------------------------------------------------------------
    def compute_log_prob(self, batch: Batch) -> Batch:
        """``old_log_probs`` and ``entropys`` (B, R)."""
        _require(batch, MODEL_INPUTS, "actor.compute_log_prob")
        return _no_grad_passes(self.module, batch, self.spec.log_prob_plan, lambda micro: dict(zip(
            ("old_log_probs", "entropys"),
            log_probs_and_entropy(self.module, micro, self.device, self.temperature, True))))

    # -- update ----------------------------------------------------------------------------------
    def update(self, batch: Batch) -> dict[str, float]:
        """One training step: an optimizer step per mini-batch, gradients accumulated over its
        micro-batches, each weighted so that their sum is the mini-batch's loss (``loss_agg_mode``)."""
        spec = self.spec
        _require(batch, MODEL_INPUTS + ("response_mask", "advantages")
                 + (("ref_log_prob",) if spec.actor.use_kl_loss else ()), "actor.update")
        lr = self.schedule.lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.module.train()
        per_step: dict[str, list[Tensor | float]] = defaultdict(list)
        for epoch in range(spec.epochs):
            order = batch
            if spec.shuffle:
                generator = torch.Generator().manual_seed((spec.seed + self.schedule.step) * 1000 + epoch)
                order = batch.select(torch.randperm(len(batch), generator=generator))
            for mini in order.split(spec.mini_batch_rows(world_size())):
                for key, value in self._mini_batch_step(mini).items():
                    per_step[key].append(value)
        self.schedule.step += 1
        metrics = read_metrics({role_metric_name("actor", key): sum(values) / len(values)
                                for key, values in per_step.items()})
        metrics["actor/lr"] = lr
        metrics["actor/nonfinite_updates"] = float(sum(not math.isfinite(n) for n in per_step["grad_norm"]))
        if spec.actor.use_kl_loss:
            metrics["actor/kl_coef"] = spec.actor.kl_loss_coef
        return metrics

    def _mini_batch_step(self, mini: Batch) -> dict[str, Tensor | float]:
        micros = micro_batches(mini, self.spec.update_plan)
        masks = [micro["response_mask"] for micro in micros]
        global_sum = _global_sum if world_size() > 1 else float
        # replicas 1: torchtitan's FSDP sums the ranks' gradients (rlcore_torchtitan.model.parallelize), so each
        # rank's micro-batch losses are weighted to sum, over all ranks, to the mini-batch's loss
        weights = loss_weights(masks, self.spec.loss_agg_mode, 1, global_sum)
        token_weights = loss_weights(masks, "token-mean", 1)
        totals: dict[str, Tensor | float] = defaultdict(float)
        for micro, weight, token_weight in zip(micros, weights, token_weights):
            loss, metrics = self._micro_loss(micro)
            (loss * weight).backward()
            for key, value in metrics.items():
                # the driver averages the ranks' metrics: a loss metric is this rank's share times the ranks
                totals[key] += (weight * world_size() if key in LOSS_METRICS else token_weight) * value
        totals["grad_norm"] = self._clip_and_step()
        return totals

    def _micro_loss(self, micro: Batch) -> tuple[Tensor, dict[str, Tensor | float]]:
        log_prob, entropy = log_probs_and_entropy(self.module, micro, self.device, self.temperature, True,
                                                  entropy_grad=entropy_in_loss(self.spec.actor))
        columns = partial(lambda batch, *keys: [to_device(batch[key], self.device) for key in keys], micro)
        return micro_batch_actor_loss(log_prob, entropy, columns, self.spec, on_policy="old_log_probs" not in micro)

    def _clip_and_step(self) -> float:
        """Clip the gradient norm to ``actor.optim.grad_clip`` and step; a non-finite norm skips the step."""
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads)
        norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
        if math.isfinite(norm):
            torch.nn.utils.clip_grads_with_norm_(self.module.parameters(), self.spec.optim.grad_clip, total)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._generation.stale = True
        return norm

    # -- weights ---------------------------------------------------------------------------------
    def weights_for_rollout(self, bucket_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
        """Full parameters by their Hugging Face names (torchtitan's adapter, ``to_hf``), in the compute
        dtype on this rank's device, bucket by bucket (every rank takes part: each gathers its shards)."""
        return weight_buckets(hf_weights(self.module, self.titan.adapter, self.compute_dtype, self.device),
                              bucket_bytes)

    def generation_module(self):
        return self._generation.lent(lambda: hf_weights(self.module, self.titan.adapter, self.compute_dtype,
                                                        self.device))

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, directory: str) -> None:
        save_checkpoint(directory, self.module, self.optimizer, self.schedule, self.titan, tokenizer=self._tokenizer(),
                        compute_dtype=self.compute_dtype, contents=self.spec.checkpoint_contents)

    def load(self, directory: str) -> None:
        load_checkpoint(directory, self.module, self.optimizer, self.schedule)
        self._generation.stale = True

    def _tokenizer(self):
        return policy_tokenizer(self.spec.model)


class TitanReference(Reference):
    """The frozen initial policy (``model.path``), or the distillation teacher (``spec.path``), as
    torchtitan's model in ``model.dtype``, sharded, no optimizer."""

    def __init__(self, spec: ReferenceSpec, platform: Platform):
        ensure_process_group(platform)
        self.spec = spec
        self.device = local_device(platform)
        dtype = resolve_dtype(spec.model.dtype, platform)
        options = options_of(spec, "ref.torchtitan")
        self.module = load_titan_model(spec.path, dtype, dtype, platform,
                                       reshard_after_forward=options.fsdp_reshard_after_forward,
                                       cpu_offload=options.enable_cpu_offload,
                                       override_config=spec.override_config).module
        self.module.requires_grad_(False)
        self.module.eval()
        self.temperature = _sampling_temperature(spec.temperature)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """``ref_log_prob`` (B, R)."""
        _require(batch, MODEL_INPUTS, "reference.compute_ref_log_prob")
        if self.spec.top_k:
            raise RlcoreError("distillation.loss = 'forward_kl_topk': trainer.backend = 'torchtitan' computes no "
                              "top-k teacher log-probs; use trainer.backend = 'fsdp'")
        return _no_grad_passes(self.module, batch, self.spec.log_prob_plan, lambda micro: {
            "ref_log_prob": log_probs_and_entropy(self.module, micro, self.device, self.temperature, False)[0]})


def _no_grad_passes(module: nn.Module, batch: Batch, plan: MicroBatchPlan, compute) -> Batch:
    """``compute`` over the batch's micro-batches in eval mode without gradients; results on the CPU."""
    was_training = module.training
    module.eval()
    parts: dict[str, list[Tensor]] = defaultdict(list)
    try:
        with torch.no_grad():
            for micro in micro_batches(batch, plan):
                for key, value in compute(micro).items():
                    parts[key].append(value.cpu())
    finally:
        module.train(was_training)
    return Batch({key: torch.cat(values) for key, values in parts.items()})


def _global_sum(value: float) -> float:
    total = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(total)
    return float(total)

