"""``[actor.megatron]``, ``[ref.megatron]``, ``[critic.megatron]``: the megatron backend's own settings
(verl: ``actor_rollout_ref.actor.megatron.*``, ``actor_rollout_ref.ref.megatron.*``,
``critic.megatron.*``, which rlcore's verl-key mapping carries onto these tables).

Actor, reference and critic of a worker share one process and so one Megatron parallel layout:
their tensor-, pipeline-, context- and expert-parallel sizes must agree: unset in ``ref`` or ``critic``
they are the actor's, and a different one is an error. The data-parallel size is what is left: workers /
(TP x PP x CP). The ``moe_*`` settings (verl: ``override_transformer_config.moe_*``) shape a mixture of
experts' router and token dispatch; the reference takes the actor's, so that its log-probs are the
actor's at step 0.
"""

from __future__ import annotations

import attrs
import torch

from rlcore.api import RlcoreError, setting
from rlcore_megatron.config_map import MoeSettings, PipelineSplit

SECTIONS = ("actor.megatron", "ref.megatron", "critic.megatron")


@attrs.frozen
class MegatronOptions:
    tensor_model_parallel_size: int | None = setting(
        None, ge=1, doc="ranks each layer's matrices are split over (unset: 1 for the actor, else the actor's)")
    pipeline_model_parallel_size: int | None = setting(
        None, ge=1, doc="stages the layers are split over (unset: 1 for the actor, else the actor's)")
    num_layers_in_first_pipeline_stage: int | None = setting(
        None, ge=1, doc="layers on the first pipeline stage, the rest split evenly over the others (unset: an even "
                        "share; the reference and critic take the actor's); with pipeline_model_parallel_size > 1")
    num_layers_in_last_pipeline_stage: int | None = setting(
        None, ge=1, doc="layers on the last pipeline stage (unset: an even share; the reference and critic take the "
                        "actor's)")
    account_for_embedding_in_pipeline_split: bool = setting(
        False, doc="count the embedding as one layer of the first pipeline stage when splitting the layers evenly "
                   "(megatron-core's setting; the first stage holds one layer fewer); not with "
                   "num_layers_in_first/last_pipeline_stage. The reference and critic take the actor's")
    account_for_loss_in_pipeline_split: bool = setting(
        False, doc="count the output layer and loss as one layer of the last pipeline stage (megatron-core's "
                   "setting; the last stage holds one layer fewer)")
    context_parallel_size: int | None = setting(
        None, ge=1, doc="ranks each sequence is split over (megatron-core's load-balanced chunks; attention "
                        "exchanges heads for tokens, Ulysses-style, without TransformerEngine); it must divide each "
                        "tensor-parallel rank's attention heads and key/value groups (unset: 1 for the actor, else "
                        "the actor's)")
    expert_model_parallel_size: int | None = setting(
        None, ge=1, doc="ranks a mixture of experts' experts are split over, within the data-parallel ranks (unset: "
                        "1 for the actor, else the actor's); with tensor_model_parallel_size 1 only")
    expert_tensor_parallel_size: int | None = setting(
        None, ge=1, doc="ranks each expert's matrices are split over: unset or tensor_model_parallel_size (experts "
                        "split like the dense layers); other sizes are refused")
    moe_token_dispatcher_type: str | None = setting(
        None, choices=(None, "alltoall", "allgather"),
        doc="how tokens reach their experts' ranks (megatron-core's dispatchers); unset: alltoall on GPUs, allgather "
            "on the CPU (gloo has no all-to-all). allgather needs fixed lengths: no pipeline parallelism. verl's "
            "'flex' (DeepEP's kernels) is read as alltoall")
    moe_router_dtype: str | None = setting(
        None, choices=(None, "fp32", "fp64"), doc="the router's logits and softmax in this precision (unset: "
                                                  "model.dtype)")
    moe_router_load_balancing_type: str | None = setting(
        None, choices=(None, "none", "aux_loss", "seq_aux_loss", "global_aux_loss"),
        doc="the load-balancing loss moe_aux_loss_coeff weighs (unset: aux_loss when the coefficient is > 0, else "
            "none); actor and critic only")
    moe_aux_loss_coeff: float = setting(0.0, ge=0.0, doc="weight of the load-balancing loss added to the RL loss's "
                                                          "gradient (0: none, the policy loss alone)")
    moe_z_loss_coeff: float | None = setting(None, ge=0.0, doc="weight of the router z-loss (the squared log-sum-exp "
                                                               "of the router's logits; unset: none)")
    use_distributed_optimizer: bool = setting(True, doc="shard fp32 master weights and Adam state over the "
                                                        "data-parallel ranks (ZeRO-1); actor and critic only")
    recompute_granularity: str | None = setting(
        None, choices=(None, "full"), doc="activation recompute (megatron-core's TransformerConfig): full layers; "
                                          "unset: model.enable_gradient_checkpointing decides")
    recompute_method: str | None = setting(None, choices=(None, "uniform", "block"),
                                           doc="uniform: every recompute_num_layers layers as one chunk; block: "
                                               "the first recompute_num_layers layers of each stage")
    recompute_num_layers: int | None = setting(None, ge=1, doc="layers per recompute chunk (uniform) or recomputed "
                                                               "layers (block)")
    param_offload: bool = setting(
        False, doc="keep the parameters in host memory between the phases that use them (log-probs, update, "
                   "weight sync, checkpoints): each phase copies them to the device and back (verl: "
                   "megatron.param_offload)")
    grad_offload: bool = setting(
        False, doc="free Megatron DDP's gradient buffers outside the update; actor and critic (verl: "
                   "megatron.grad_offload)")
    optimizer_offload: bool = setting(
        False, doc="keep Adam's states on the CPU and step there: megatron-core's optimizer_cpu_offload "
                   "(HybridDeviceOptimizer); actor and critic (verl: megatron.optimizer_offload, "
                   "optim.override_optimizer_config.optimizer_cpu_offload)")
    optimizer_offload_fraction: float = setting(1.0, ge=0.0, le=1.0,
                                                doc="the share of Adam's states kept on the CPU by optimizer_offload")
    overlap_cpu_optimizer_d2h_h2d: bool = setting(
        False, doc="overlap the CPU step with the copies between devices (optimizer_offload only)")
    use_precision_aware_optimizer: bool = setting(
        False, doc="megatron-core's precision-aware Adam, with optimizer_offload only (without it, it needs "
                   "TransformerEngine's FusedAdam, which rlcore does not use)")
    use_dist_checkpointing: bool = setting(
        False, doc="take the starting weights from the megatron-core distributed checkpoint at "
                   "dist_checkpointing_path (verl's converted checkpoints: TransformerEngine's layer names) instead of "
                   "the Hugging Face folder, which still gives the config and tokenizer; any tensor, pipeline or "
                   "expert parallel size (megatron-core reshards)")
    dist_checkpointing_path: str | None = setting(
        None, doc="the distributed checkpoint's folder (the one holding its metadata.json), with "
                  "use_dist_checkpointing")
    dist_checkpointing_prefix: str = setting(
        "", doc="what stands before the model's keys in that checkpoint (NeMo 2 writes 'module.')")


def recompute_kwargs(options: MegatronOptions, gradient_checkpointing: bool) -> dict:
    """megatron-core's recompute arguments: verl's override_transformer_config.recompute_* when set,
    else full uniform recompute of every layer when gradient checkpointing is on."""
    if options.recompute_granularity is None:
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1} \
            if gradient_checkpointing else {}
    return {"recompute_granularity": options.recompute_granularity,
            "recompute_method": options.recompute_method or "uniform",
            "recompute_num_layers": options.recompute_num_layers or 1}


def optimizer_offload_kwargs(options: MegatronOptions, section: str) -> dict:
    """megatron-core ``OptimizerConfig`` arguments for ``optimizer_offload``; an error naming the
    key for a combination megatron-core cannot build."""
    if not options.optimizer_offload:
        for key in ("use_precision_aware_optimizer", "overlap_cpu_optimizer_d2h_h2d"):
            if getattr(options, key):
                raise RlcoreError(f"{section}.{key} works with {section}.optimizer_offload = true only")
        return {}
    if not options.use_distributed_optimizer:
        raise RlcoreError(f"{section}.optimizer_offload needs {section}.use_distributed_optimizer = true")
    return {"optimizer_cpu_offload": True, "optimizer_offload_fraction": options.optimizer_offload_fraction,
            "overlap_cpu_optimizer_d2h_h2d": options.overlap_cpu_optimizer_d2h_h2d,
            "use_precision_aware_optimizer": options.use_precision_aware_optimizer}


def dist_checkpoint_start(spec, section: str) -> tuple[str, str] | None:
    """(path, key prefix) of the distributed checkpoint ``section`` starts from, or None: it starts
    from the Hugging Face folder."""
    options = options_of(spec, section)
    if not options.use_dist_checkpointing:
        if options.dist_checkpointing_path is not None:
            raise RlcoreError(f"{section}.dist_checkpointing_path is set but {section}.use_dist_checkpointing is "
                              "false: set it to true to start from that checkpoint, or remove the path")
        return None
    if not options.dist_checkpointing_path:
        raise RlcoreError(f"{section}.use_dist_checkpointing = true needs {section}.dist_checkpointing_path: the "
                          "folder of the megatron-core distributed checkpoint (verl's converter's output)")
    return options.dist_checkpointing_path, options.dist_checkpointing_prefix


def options_of(spec, section: str) -> MegatronOptions:
    """The options of ``section`` among the plugin tables of a role's spec (``rlcore.api.TrainingSpec.sections``);
    the defaults for a job built in code rather than loaded (it carries no plugin tables)."""
    return spec.sections.get(section, MegatronOptions())


def _own_or_actors(spec, section: str, *names: str) -> tuple:
    """``section``'s settings ``names``, each one left unset (None, False) taken from the actor's."""
    own, actor = options_of(spec, section), options_of(spec, "actor.megatron")
    return tuple(getattr(own, name) or getattr(actor, name) for name in names)


def parallel_sizes(spec, section: str) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes of ``section``: its own, else the actor's, else 1."""
    tp, pp = _own_or_actors(spec, section, "tensor_model_parallel_size", "pipeline_model_parallel_size")
    return tp or 1, pp or 1


def context_parallel_size(spec, section: str) -> int:
    """The context-parallel size of ``section``, unset: the actor's, else 1."""
    (cp,) = _own_or_actors(spec, section, "context_parallel_size")
    return cp or 1


def pipeline_split(spec, section: str) -> PipelineSplit:
    """How ``section``'s layers split over the pipeline stages, unset: as the actor's."""
    return PipelineSplit(*_own_or_actors(spec, section, "num_layers_in_first_pipeline_stage",
                                         "num_layers_in_last_pipeline_stage",
                                         "account_for_embedding_in_pipeline_split",
                                         "account_for_loss_in_pipeline_split"))


def expert_parallel_sizes(spec, section: str) -> tuple[int, int | None]:
    """(expert parallel, expert tensor parallel) sizes of ``section``, unset: the actor's (expert
    parallel: else 1; expert tensor parallel: else None, the tensor-parallel size)."""
    ep, etp = _own_or_actors(spec, section, "expert_model_parallel_size", "expert_tensor_parallel_size")
    return ep or 1, etp


def moe_settings(spec, section: str, device: torch.device) -> MoeSettings:
    """The ``moe_*`` settings for ``section``'s model on ``device`` (the reference: the actor's, so
    that both route alike; its loss coefficients have no use, it has no backward pass)."""
    options = options_of(spec, "actor.megatron" if section == "ref.megatron" else section)
    # gloo (the CPU) has no all-to-all; the alltoall dispatcher also makes a CUDA stream
    default = "allgather" if device.type == "cpu" else "alltoall"
    return MoeSettings(token_dispatcher=options.moe_token_dispatcher_type or default,
                       router_dtype=options.moe_router_dtype, load_balancing=options.moe_router_load_balancing_type,
                       aux_loss_coeff=options.moe_aux_loss_coeff, z_loss_coeff=options.moe_z_loss_coeff)
