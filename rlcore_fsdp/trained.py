"""What the actor and the critic share: a sharded model with AdamW, its schedule, the update loop
(epochs x mini-batches x micro-batches with accumulation), and checkpoints."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor, nn

from rlcore.api import (
    Batch,
    LrSchedule,
    Platform,
    TrainedSpec,
    local_device,
    read_metrics,
    role_metric_name,
    to_device,
)
from rlcore_fsdp.batching import MicroBatch, micro_batches, micro_weights, mini_batches
from rlcore_fsdp.checkpoint import load_checkpoint, save_checkpoint
from rlcore_fsdp.offload import move_optimizer_state
from rlcore_fsdp.optim import build_optimizer, clip_and_step, set_lr
from rlcore_fsdp.options import FsdpOptions
from rlcore_fsdp.sharding import accumulates_unreduced

MicroLoss = Callable[[Batch], tuple[Tensor, dict[str, Tensor | float]]]
# what a micro-batch's forward and backward run inside (the actor's router replay: a backward that
# recomputes the forward under gradient checkpointing must route as the forward did)
MicroContext = Callable[[Batch], AbstractContextManager]
# metrics aggregated like the loss (loss_agg_mode): combined like the loss; the rest are token means
LOSS_METRICS = frozenset({"pg_loss", "entropy", "kl_loss", "vf_loss"})
CPU = torch.device("cpu")


class TrainedModel:
    """A sharded ``module`` with its optimizer and learning-rate schedule."""

    role: str = ""  # "actor" or "critic": the metric prefix and config section
    lora: dict | None = None  # LoRA's rank and alpha when only adapters train (rlcore_fsdp.lora)
    base_model: str | None = None  # the model path the frozen weights come from, under LoRA
    def __init__(self, module: nn.Module, spec: TrainedSpec, fsdp: FsdpOptions, platform: Platform,
                 compute_dtype: torch.dtype):
        self.module = module
        self.spec = spec  # the role's spec: optimizer, update loop, what a checkpoint holds
        self.platform = platform
        self.device = local_device(platform)
        self.compute_dtype = compute_dtype
        self.packed = spec.model.use_remove_padding  # micro-batches run as packed rows
        self.optim_config = spec.optim
        self.optimizer = build_optimizer(module, spec.optim)
        self.schedule = LrSchedule(spec.optim, f"{self.role}.optim", total_steps=spec.total_steps)
        # with param_offload the optimizer steps on the CPU already; otherwise park its state there
        self.park_optimizer = fsdp.optimizer_offload and not fsdp.param_offload
        # one device: gradients reduced after a mini-batch's last micro-batch only (sharding.accumulates_unreduced)
        self.reduce_last_micro_batch_only = accumulates_unreduced(module, fsdp)

    def set_total_steps(self, total_steps: int) -> None:
        """The number of training steps of the run, for warmup ratios and the cosine schedule."""
        self.schedule.total_steps = total_steps

    def run_updates(self, batch: Batch, *, mini_rows: int, epochs: int, shuffle: bool, seed: int,
                    micro_rows: int | None, token_budget: int | None, budget_name: str, loss_agg_mode: str,
                    micro_loss: MicroLoss, micro_context: MicroContext | None = None) -> dict[str, float]:
        """One training step: an optimizer step per mini-batch, gradients accumulated over its
        micro-batches (``micro_rows`` rows each, or balanced within ``token_budget`` tokens); then the
        schedule advances. Metrics are those of each whole mini-batch (``LOSS_METRICS`` combined as
        the loss is, the others token-weighted), averaged over mini-batches, under ``<role>/``: summed on the
        device as the losses give them and read once, at the end, so no micro-batch waits for the device."""
        lr = self.schedule.lr()
        set_lr(self.optimizer, lr)
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        if self.park_optimizer:
            move_optimizer_state(self.optimizer, self.device)
        per_step: dict[str, list[Tensor | float]] = defaultdict(list)
        try:
            for mini in mini_batches(batch, mini_rows, epochs, shuffle, seed):
                micros = micro_batches(mini, micro_rows, token_budget, packed=self.packed, budget_name=budget_name)
                loss_weights = micro_weights(micros, loss_agg_mode)
                metric_weights = micro_weights(micros, "token-mean")
                totals: dict[str, Tensor | float] = defaultdict(float)
                for index, (micro, loss_weight, metric_weight) in enumerate(zip(micros, loss_weights, metric_weights)):
                    if self.reduce_last_micro_batch_only:
                        self.module.set_requires_gradient_sync(index == len(micros) - 1)
                    with micro_context(micro.batch) if micro_context else nullcontext():
                        loss, metrics = micro_loss(micro.batch)
                        (loss * loss_weight).backward()
                    for key, value in metrics.items():
                        totals[key] += (loss_weight if key in LOSS_METRICS else metric_weight) * value
                for key, value in totals.items():
                    per_step[key].append(value)
                per_step["grad_norm"].append(clip_and_step(self.module, self.optimizer, self.optim_config.grad_clip,
                                                              self.role))
        finally:
            if self.reduce_last_micro_batch_only:  # a failed micro-batch must not leave later backwards unreduced
                self.module.set_requires_gradient_sync(True)
            if self.park_optimizer:
                move_optimizer_state(self.optimizer, CPU)
        self.schedule.step += 1
        metrics = read_metrics({role_metric_name(self.role, key): sum(values) / len(values)
                                for key, values in per_step.items()})
        metrics[f"{self.role}/lr"] = lr
        # clip_and_step skipped these (a non-finite loss makes a non-finite norm); the driver counts them
        metrics[f"{self.role}/nonfinite_updates"] = float(sum(not math.isfinite(n) for n in per_step["grad_norm"]))
        return metrics

    def save(self, directory: str) -> None:
        save_checkpoint(directory, self.module, self.optimizer, self.schedule, tokenizer=self._tokenizer(),
                        role=self.role, compute_dtype=self.compute_dtype, lora=self.lora, base_model=self.base_model,
                        contents=self.spec.checkpoint_contents)

    def load(self, directory: str) -> None:
        load_checkpoint(directory, self.module, self.optimizer, self.schedule, base_model=self.base_model)
        if self.park_optimizer:
            move_optimizer_state(self.optimizer, CPU)

    def _tokenizer(self):
        return None

    def to_device(self, batch: Batch, *keys: str) -> list[Tensor]:
        return [to_device(batch[key], self.device) for key in keys]


def no_grad_batches(module: nn.Module, batch: Batch, micro_rows: int | None, token_budget: int | None,
                    compute: Callable[[Batch], dict[str, Tensor]], *, packed: bool = False,
                    budget_name: str = "the token budget") -> Batch:
    """``compute`` over micro-batches in eval mode without gradients; results on the CPU, in the
    batch's row order."""
    was_training = module.training
    module.eval()
    parts: dict[str, list[Tensor]] = defaultdict(list)
    order: list[Tensor] = []
    try:
        with torch.no_grad():
            micros: list[MicroBatch] = micro_batches(batch, micro_rows, token_budget, packed=packed,
                                                     budget_name=budget_name)
            for micro in micros:
                outputs = compute(micro.batch)
                if micro.is_filler:
                    continue
                order.append(micro.rows)
                for key, value in outputs.items():  # kept where computed: one copy to the host at the end,
                    parts[key].append(value)  # not a wait for the device after every micro-batch
    finally:
        module.train(was_training)
    inverse = torch.argsort(torch.cat(order)) if order else torch.zeros(0, dtype=torch.long)
    return Batch({key: torch.cat(values).cpu().index_select(0, inverse) for key, values in parts.items()})
