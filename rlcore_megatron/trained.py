"""What the megatron actor, reference and critic share: building the model of a role, forward passes
over a batch, and (actor, critic) Megatron's DDP with its optimizer, the update loop and checkpoints."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rlcore.api import (
    Batch,
    LrSchedule,
    Platform,
    RlcoreError,
    TrainedSpec,
    TrainingSpec,
    ensure_process_group,
    local_device,
    read_metrics,
    resolve_dtype,
    role_metric_name,
    to_device,
)
from rlcore_megatron.compute import (
    Micro,
    from_last_stage,
    micro_batches,
    micro_weights,
    object_from_last_stage,
    plan_micro_batches,
    run_schedule,
    share_within_model_parallel,
)
from rlcore_megatron.config_map import check_parallel_sizes
from rlcore_megatron.dist_start import load_dist_weights
from rlcore_megatron.model import (
    HfCheckpoint,
    build_model,
    import_megatron,
    load_hf_weights,
    new_value_head,
    setup_parallel,
    shape_of,
)
from rlcore_megatron.offload import ModelOffload
from rlcore_megatron.options import (
    MegatronOptions,
    context_parallel_size,
    dist_checkpoint_start,
    expert_parallel_sizes,
    moe_settings,
    optimizer_offload_kwargs,
    options_of,
    parallel_sizes,
    pipeline_split,
    recompute_kwargs,
)

if TYPE_CHECKING:
    from rlcore_megatron.routing import RoutingReplay


MODEL_INPUTS = ("input_ids", "attention_mask", "responses")
# metrics aggregated like the loss (loss_agg_mode); the rest are token means
LOSS_METRICS = frozenset({"pg_loss", "entropy", "kl_loss", "vf_loss"})
# compute(micro, last-stage output) -> {key: (b, R) tensor}
Compute = Callable[[Micro, Tensor], dict[str, Tensor]]
# micro_loss(micro, last-stage output) -> (loss, metrics)
MicroLoss = Callable[[Micro, Tensor], tuple[Tensor, dict[str, Tensor | float]]]


def with_wide_routing(batch: Batch) -> Batch:
    """The batch with its ``routed_experts`` column (int16 in the batch) as int64 for the collectives
    that share rows (NCCL has no 16-bit integers)."""
    if "routed_experts" not in batch:
        return batch
    return batch.update(Batch({"routed_experts": batch["routed_experts"].long()}))


def require(batch: Batch, keys: tuple[str, ...], what: str) -> None:
    missing = [key for key in keys if key not in batch]
    if missing:
        raise RlcoreError(f"{what} needs batch keys {', '.join(missing)}; the batch has {', '.join(batch.tensors)}")


class MegatronModel:
    """One role's stage of the model on this rank, loaded from a Hugging Face folder."""

    def __init__(self, spec: TrainingSpec, platform: Platform, *, section: str, value_head: bool = False,
                 gradient_checkpointing: bool = False):
        import_megatron()
        if spec.model.use_remove_padding:
            raise RlcoreError("model.use_remove_padding (packed rows) is not supported by trainer.backend = "
                              "'megatron': its local layer spec has no variable-length attention; set it to false")
        ensure_process_group(platform)
        self.spec = spec
        self.platform = platform
        self.device = local_device(platform)
        self.path = path = spec.path
        self.value_head = value_head
        self.hf_config, self.shape = shape_of(path, spec.model.trust_remote_code)
        tp, pp = parallel_sizes(spec, section)
        (ep, etp), split = expert_parallel_sizes(spec, section), pipeline_split(spec, section)
        cp = context_parallel_size(spec, section)
        check_parallel_sizes(self.shape, tp, pp, section, expert_parallel=ep, expert_tensor_parallel=etp, split=split,
                             context_parallel=cp)
        self.layout = setup_parallel(tp, pp, section, spec.seed, ep=ep, cp=cp)
        self.compute_dtype = resolve_dtype(spec.model.dtype, platform)
        self.gpt = build_model(self.shape, self.layout, self.compute_dtype, self.device, value_head=value_head,
                               gradient_checkpointing=gradient_checkpointing,
                               recompute=recompute_kwargs(options_of(spec, section), gradient_checkpointing) or None,
                               moe=moe_settings(spec, section, self.device), split=split)
        start = dist_checkpoint_start(spec, section)
        if start is None:
            load_hf_weights(self.gpt, HfCheckpoint(path, spec.model.trust_remote_code), self.shape, self.layout,
                            value_head=value_head, seed=spec.seed)
        else:
            load_dist_weights(self.gpt, start[0], section=section, prefix=start[1],
                              skip=("output_layer.",) if value_head else ())
            if value_head:  # a language model's checkpoint: the critic's value head is new, as verl's
                new_value_head(self.gpt, self.shape, self.layout, seed=spec.seed)
        self.model: torch.nn.Module = self.gpt  # what the schedule runs (wrapped in DDP when trained)
        self.router_replay: RoutingReplay | None = None  # set up by the actor under actor.router_replay
        self.offload = ModelOffload(self.gpt, params=False, grads=False)  # set up by setup_offload

    def setup_offload(self, section: str, ddp_buffers=()) -> None:
        """Park the parameters (``param_offload``) and gradient buffers (``grad_offload``) of
        ``section`` in host memory until a phase needs them."""
        options = options_of(self.spec, section)
        if options.grad_offload and not ddp_buffers:
            raise RlcoreError(f"{section}.grad_offload: this role has no gradients (it is not trained); "
                              "leave it false")
        self.offload = ModelOffload(self.gpt, ddp_buffers, params=options.param_offload, grads=options.grad_offload)
        if self.offload.enabled:
            self.offload.park()

    def forward_rows(self, batch: Batch, keys: Sequence[str], micro_rows: int | None, token_budget: int | None,
                     budget_name: str, compute: Compute, routing: str = "off") -> Batch:
        """``compute`` on the last stage's output for every micro-batch, without gradients; (B, R)
        fp32 results on the CPU for this rank's own rows, in order. ``routing`` (``router_replay``
        set up): "record" adds the (B, P+R, L, K) column ``routed_experts`` of the experts chosen,
        "replay" routes as the batch's column says."""
        with self.offload.resident():
            return self._forward_rows(batch, keys, micro_rows, token_budget, budget_name, compute, routing)

    def _forward_rows(self, batch: Batch, keys: Sequence[str], micro_rows: int | None, token_budget: int | None,
                      budget_name: str, compute: Compute, routing: str = "off") -> Batch:
        inputs = MODEL_INPUTS + (("routed_experts",) if routing == "replay" else ())
        shared, mine = share_within_model_parallel(with_wide_routing(batch), inputs, self.device)
        micros = micro_batches(shared, plan_micro_batches(shared, micro_rows, token_budget, budget_name), ())
        routing_pass = self.router_replay.start(routing, training=False) if routing != "off" else None

        def on_output(index: int, micro: Micro, output: Tensor):
            return output.new_zeros(()), {key: value.detach().float() for key, value in compute(micro, output).items()}

        was_training = self.model.training
        self.model.eval()
        try:
            reduced = run_schedule(self.model, micros, on_output, self.device, forward_only=True,
                                   routing=routing_pass, sliding_window=self.shape.sliding_window)
            routed = routing_pass.column(micros, shared, self.device) if routing == "record" else None
        finally:
            self.model.train(was_training)
            if routing_pass is not None:
                self.router_replay.stop()
        rows, width = len(shared), shared["responses"].shape[1]
        values = None
        if self.layout.last_stage:
            order = torch.cat([m.rows for m in micros])
            values = {}
            for key in keys:
                full = torch.zeros(rows, width)
                full[order] = torch.cat([r[key].cpu() for r in reduced])
                values[key] = full
        values = from_last_stage(values, {key: (rows, width) for key in keys}, self.layout, self.device)
        if routed is not None:
            values["routed_experts"] = routed
        return Batch({key: value[mine] for key, value in values.items()})


class TrainedModel(MegatronModel):
    """A role's model under Megatron's ``DistributedDataParallel`` with Megatron's optimizer (Adam
    with decoupled weight decay, fp32 master weights, the distributed optimizer if asked for), a
    learning-rate schedule and the update loop."""

    role = ""  # "actor" or "critic": the metric prefix

    def __init__(self, spec: TrainedSpec, platform: Platform, *, section: str, value_head: bool = False,
                 gradient_checkpointing: bool = False):
        super().__init__(spec, platform, section=section, value_head=value_head,
                         gradient_checkpointing=gradient_checkpointing)
        options: MegatronOptions = options_of(spec, section)
        optim = spec.optim
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        model_config = self.gpt.config
        self.model = DistributedDataParallel(
            config=model_config, module=self.gpt,
            ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                                     use_distributed_optimizer=options.use_distributed_optimizer))
        dtype = self.compute_dtype
        self.optimizer = get_megatron_optimizer(OptimizerConfig(
            optimizer="adam", lr=optim.lr, weight_decay=optim.weight_decay, adam_beta1=optim.betas[0],
            adam_beta2=optim.betas[1], adam_eps=optim.eps, clip_grad=optim.grad_clip, bf16=dtype == torch.bfloat16,
            fp16=dtype == torch.float16, params_dtype=dtype,
            use_distributed_optimizer=options.use_distributed_optimizer,
            **optimizer_offload_kwargs(options, section)), [self.model])
        # what the schedule calls: the data-parallel gradient reduction after the last micro-batch,
        # and the loss scale (fp16) before each backward
        model_config.finalize_model_grads_func = finalize_model_grads
        model_config.grad_scale_func = self.optimizer.scale_loss
        self.schedule = LrSchedule(optim, f"{self.role}.optim", total_steps=spec.total_steps)
        self.setup_offload(section, self.model.buffers + self.model.expert_parallel_buffers)

    def set_total_steps(self, total_steps: int) -> None:
        """The number of training steps of the run, for warmup ratios and the cosine schedule."""
        self.schedule.total_steps = total_steps

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)

    def run_updates(self, batch: Batch, *, extra_keys: Sequence[str], epochs: int, shuffle: bool, seed: int,
                    micro_rows: int | None, token_budget: int | None, budget_name: str, loss_agg_mode: str,
                    micro_loss: MicroLoss) -> dict[str, float]:
        """One training step: an optimizer step per mini-batch, gradients accumulated over its
        micro-batches by Megatron's schedule; then the schedule advances. Metrics are those of each
        whole mini-batch (``LOSS_METRICS`` combined as the loss is, the others token-weighted),
        averaged over mini-batches, under ``<role>/``."""
        with self.offload.resident(grads=True):
            return self._run_updates(batch, extra_keys=extra_keys, epochs=epochs, shuffle=shuffle, seed=seed,
                                     micro_rows=micro_rows, token_budget=token_budget, budget_name=budget_name,
                                     loss_agg_mode=loss_agg_mode, micro_loss=micro_loss)

    def _run_updates(self, batch: Batch, *, extra_keys: Sequence[str], epochs: int, shuffle: bool, seed: int,
                     micro_rows: int | None, token_budget: int | None, budget_name: str, loss_agg_mode: str,
                     micro_loss: MicroLoss) -> dict[str, float]:
        layout = self.layout
        shared, _ = share_within_model_parallel(with_wide_routing(batch), MODEL_INPUTS + tuple(extra_keys),
                                                self.device)
        mini_rows = self.spec.mini_batch_rows(layout.data_parallel)
        lr = self.schedule.lr()
        self._set_lr(lr)
        self.model.train()
        per_step: dict[str, list[float]] = defaultdict(list)
        for epoch in range(epochs):
            order = (torch.randperm(len(shared), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
                     if shuffle else torch.arange(len(shared)))
            for mini in shared.select(order).split(mini_rows):
                totals = self._mini_batch(mini, extra_keys, micro_rows, token_budget, budget_name, loss_agg_mode,
                                          micro_loss)
                for key, value in totals.items():
                    per_step[key].append(value)
        self.schedule.step += 1
        metrics = {role_metric_name(self.role, key): sum(values) / len(values) for key, values in per_step.items()}
        metrics[f"{self.role}/lr"] = lr
        return metrics

    def _mini_batch(self, mini: Batch, extra_keys, micro_rows, token_budget, budget_name, loss_agg_mode,
                    micro_loss: MicroLoss) -> dict[str, float]:
        micros = micro_batches(mini, plan_micro_batches(mini, micro_rows, token_budget, budget_name), extra_keys)
        dp = self.layout.data_parallel
        loss_weights = micro_weights(micros, loss_agg_mode, dp, self.device)
        metric_weights = micro_weights(micros, "token-mean", dp, self.device)

        def on_output(index: int, micro: Micro, output: Tensor):
            loss, metrics = micro_loss(micro, output)
            reduced = {key: (loss_weights[index] if key in LOSS_METRICS else metric_weights[index]) * value
                       for key, value in metrics.items()}
            # Megatron divides each micro-batch's loss by their count; its DDP averages over data-parallel ranks
            return loss * (loss_weights[index] * len(micros)), reduced

        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        replaying = "routed_experts" in extra_keys
        routing_pass = self.router_replay.start("replay", training=True) if replaying else None
        try:
            reduced = run_schedule(self.model, micros, on_output, self.device, forward_only=False,
                                   routing=routing_pass, sliding_window=self.shape.sliding_window)
        finally:
            if routing_pass is not None:
                self.router_replay.stop()
        totals: dict[str, Tensor | float] = defaultdict(float)
        for values in reduced:
            for key, value in values.items():
                totals[key] += value
        totals = object_from_last_stage(read_metrics(totals), self.layout)
        succeeded, grad_norm, _ = self.optimizer.step()
        totals["grad_norm"] = float(grad_norm) if succeeded and grad_norm is not None else float("nan")
        return totals

    def save(self, directory: str) -> None:
        from rlcore_megatron.checkpoint import save_checkpoint

        with self.offload.resident():
            save_checkpoint(directory, self, tokenizer=self._tokenizer(),
                            contents=self.spec.checkpoint_contents)

    def load(self, directory: str) -> None:
        from rlcore_megatron.checkpoint import load_checkpoint

        with self.offload.resident():
            load_checkpoint(directory, self)

    def export_hf(self, directory: str, dtype: torch.dtype | None = None) -> None:
        """The current weights as a Hugging Face folder transformers loads (every rank takes part)."""
        from rlcore_megatron.checkpoint import export_huggingface

        with self.offload.resident():
            export_huggingface(self, directory, dtype=dtype, tokenizer=self._tokenizer())

    def _tokenizer(self):
        return None

    def to_device(self, micro: Micro, *keys: str) -> list[Tensor]:
        return [to_device(micro.extras[key], self.device) for key in keys]
