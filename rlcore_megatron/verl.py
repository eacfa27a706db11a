"""What this backend does with verl's Megatron keys (``*.megatron.*``): the settings it takes land on
its own tables, the others are ignored or refused with the reason."""

from rlcore.api import VerlIgnore, VerlKeys, VerlRefuse

NOT_YET = "not implemented in rlcore yet"
TRANSFORMER = "*.megatron.override_transformer_config."
# verl's override_transformer_config.moe_* keys that this backend takes as [<role>.megatron] settings
MOE_SETTINGS = ("moe_router_dtype", "moe_token_dispatcher_type", "moe_router_load_balancing_type",
                "moe_aux_loss_coeff", "moe_z_loss_coeff")
MOE_TAKEN = "of verl's moe_* overrides rlcore takes " + ", ".join(MOE_SETTINGS)
PIPELINE_SPLIT = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                  "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
# (verl's override_optimizer_config key, this backend's setting): megatron-core's optimizer CPU offload
OPTIMIZER_OFFLOAD = (("optimizer_cpu_offload", "optimizer_offload"),
                     ("optimizer_offload_fraction", "optimizer_offload_fraction"),
                     ("offload_fraction", "optimizer_offload_fraction"),
                     ("overlap_cpu_optimizer_d2h_h2d", "overlap_cpu_optimizer_d2h_h2d"),
                     ("use_precision_aware_optimizer", "use_precision_aware_optimizer"))

# The megatron-lite engine's short names (actor_rollout_ref.actor.engine.*, with actor@actor_rollout_ref.actor=
# mlite_actor), on this backend's settings
ENGINE = "actor_rollout_ref.actor.engine."
ENGINE_ALIASES = (("actor@actor_rollout_ref.actor", "trainer.backend"),
                  (ENGINE + "tp", "actor.megatron.tensor_model_parallel_size"),
                  (ENGINE + "pp", "actor.megatron.pipeline_model_parallel_size"),
                  (ENGINE + "ep", "actor.megatron.expert_model_parallel_size"),
                  (ENGINE + "etp", "actor.megatron.expert_tensor_parallel_size"),
                  (ENGINE + "cp", "actor.megatron.context_parallel_size"),
                  (ENGINE + "optimizer_offload", "actor.megatron.optimizer_offload"),
                  (ENGINE + "param_offload", "actor.megatron.param_offload"),
                  (ENGINE + "grad_offload", "actor.megatron.grad_offload"),
                  (ENGINE + "impl_cfg.use_thd", "model.use_remove_padding"),  # THD: packed sequences
                  (ENGINE + "impl_cfg.recompute", "actor.megatron.recompute_granularity"))
# The megatron-lite engine's impl_cfg.recompute: a list of what to recompute, "full" for each whole
# transformer layer (megatron-core's full granularity, uniform, one layer a chunk: recompute_kwargs'
# defaults), or names of modules within a layer (core_attn, mlp, moe, experts, router, mlp_norm,
# attn_proj) for selective recompute; "none" or [] for none
LITE_RECOMPUTE = {("full",): "full", "full": "full", (): None, "none": None}
ENGINE_RULES = (
    ((ENGINE + "impl_cfg.recompute",),
     VerlRefuse("rlcore recomputes whole layers ([full]: actor.megatron.recompute_granularity=full); recomputing "
                "named modules within a layer (selective recompute) is " + NOT_YET, ("full", None), mapped=True)),
    (("actor@actor_rollout_ref.actor", *(name for name, _ in ENGINE_ALIASES[1:])), None),  # mapped above
    ((ENGINE + "vpp",), VerlRefuse("virtual pipeline stages are " + NOT_YET, (1, None))),
    ((ENGINE + "attention_backend_override", ENGINE + "impl_cfg.optimizer"),
     VerlIgnore("tuning", "the megatron-lite engine's attention kernel and optimizer-state layout; the results "
                          "are the same without them")),
)

# verl's trainer configs built on this backend (a launch script's --config-name): each is verl's
# ppo_trainer with model_engine=megatron, the fully-async and one-step-off-policy ones too
CONFIG_NAMES = {name: {"trainer.backend": "megatron"} for name in (
    "ppo_megatron_trainer", "fully_async_ppo_megatron_trainer", "one_step_off_ppo_megatron_trainer")}

VERL_KEYS = VerlKeys(
    # verl's TransformerConfig overrides that this backend has as its own settings, and megatron-core's
    # optimizer CPU offload as verl's override_optimizer_config spells it
    aliases=(("actor_rollout_ref.actor.megatron.override_transformer_config.", "actor.megatron."),
             ("critic.megatron.override_transformer_config.", "critic.megatron."),
             *((f"{verl}.optim.override_optimizer_config.{name}", f"{ours}.megatron.{target}")
               for verl, ours in (("actor_rollout_ref.actor", "actor"), ("critic", "critic"))
               for name, target in OPTIMIZER_OFFLOAD),
             # verl's megatron engine spells the actor's router replay under its table
             ("actor_rollout_ref.actor.megatron.router_replay.mode", "actor.router_replay"),
             *ENGINE_ALIASES),
    # Hydra's actor config group (actor@actor_rollout_ref.actor=mlite_actor): the megatron-lite engine is
    # megatron-core, this backend
    values={"trainer.backend": {"mlite_actor": "megatron", "megatron_actor": "megatron"},
            "actor.megatron.recompute_granularity": LITE_RECOMPUTE,
            # the flex dispatcher is megatron-core's door to DeepEP's and HybridEP's kernels, which rlcore
            # does not use; its alltoall dispatcher sends the same tokens to the same experts
            **{f"{role}.megatron.moe_token_dispatcher_type": {"flex": "alltoall"}
               for role in ("actor", "ref", "critic")}},
    rules=(
        (("actor_rollout_ref.actor.megatron.router_replay.mode",), None),  # mapped above
        *ENGINE_RULES,
        # verl's newer engine config groups for the reference and critic (the megatron-lite engine)
        (("critic@*", "ref@*", "actor_rollout_ref.ref.engine.*", "critic.engine.*"),
         VerlRefuse("verl's megatron-lite engine settings are not rlcore's: use trainer.backend=megatron with "
                    "actor.megatron.tensor_model_parallel_size, pipeline_model_parallel_size, optimizer_offload and "
                    "recompute_granularity")),
        (("actor_rollout_ref.ref.megatron.override_transformer_config*",),
         VerlIgnore("machinery", "the reference is frozen: no optimizer, no backward pass to recompute for")),
        (("*.megatron.use_mbridge", "*.megatron.vanilla_mbridge", "*.megatron.dist_ckpt_optim_fully_reshardable",
          "*.megatron.distrib_optim_fully_reshardable_mem_efficient"),
         VerlIgnore("machinery", "rlcore's workers, data loading and checkpoints work without it")),
        (("*.megatron.pad_bshd_to_minibatch_max", "*.megatron.max_seqlen_per_dp_cp_rank", "*.megatron.sequence_parallel",
          TRANSFORMER + "sequence_parallel", TRANSFORMER + "attention_backend", "*.megatron.use_remove_padding"),
         VerlIgnore("tuning", "rlcore runs without it")),
        (("*.megatron.seed", "*.megatron.dtype"),
         VerlIgnore("derived", "from model.* (the critic reads the actor's tokens), trainer.seed, rollout.n, "
                               "data.max_*_length, actor.shuffle, the backend or the estimator")),
        # offload: parameters to host memory and gradient buffers freed between phases (param_offload,
        # grad_offload), Adam's states on the CPU (optimizer_offload, megatron-core's optimizer_cpu_offload)
        (("actor_rollout_ref.ref.megatron.optimizer_offload", "actor_rollout_ref.ref.megatron.grad_offload"),
         VerlIgnore("machinery", "the reference is frozen: it has no optimizer and no gradients")),
        (("*.megatron.optimizer_offload", "*.megatron.param_offload", "*.megatron.grad_offload"), None),
        (tuple(f"{role}.optim.override_optimizer_config.{name}" for role in ("actor_rollout_ref.actor", "critic")
               for name, _ in OPTIMIZER_OFFLOAD), None),  # mapped by the aliases above
        (("*.megatron.context_parallel_size", "*.megatron.expert_model_parallel_size",
          "*.megatron.expert_tensor_parallel_size"), None),
        (("*.megatron.virtual_pipeline_model_parallel_size",),
         VerlRefuse("virtual pipeline stages are " + NOT_YET, (None, 1))),
        # the starting weights from a megatron-core distributed checkpoint (verl's converter's), by
        # TransformerEngine's layer names (rlcore_megatron/dist_start.py)
        (("*.megatron.use_dist_checkpointing", "*.megatron.dist_checkpointing_path",
          "*.megatron.dist_checkpointing_prefix"), None),
        (("*.megatron.use_megatron_fsdp",),
         VerlIgnore("tuning", "megatron-core's FSDP also shards parameters and gradients; this backend keeps "
                              "megatron-core's DistributedDataParallel with the distributed optimizer (optimizer "
                              "states sharded): more memory per GPU, the same updates")),
        (("*.megatron.dynamic_context_parallel",),
         VerlRefuse("rlcore's megatron backend keeps megatron-core's own data-parallel layout "
                    "(DistributedDataParallel)", (False,))),
        (("*.megatron.override_ddp_config", "*.megatron.override_mcore_model_config"),
         VerlRefuse("rlcore builds megatron-core's configs from the model; " + NOT_YET + " to override them",
                    ({}, None))),
        ((TRANSFORMER + "recompute_granularity", TRANSFORMER + "recompute_method",
          TRANSFORMER + "recompute_num_layers"), None),  # mapped by the aliases above
        (tuple(TRANSFORMER + name for name in (
            "apply_rope_fusion", "gradient_accumulation_fusion", "bias_activation_fusion", "bias_dropout_fusion",
            "masked_softmax_fusion", "use_fused_rmsnorm", "use_fused_swiglu", "moe_permute_fusion", "use_flash_attn",
            "persist_layer_norm", "cross_entropy_loss_fusion", "use_naive_l2norm", "use_triton_gdn", "use_ascend_gdn")),
         VerlIgnore("tuning", "fused kernels; rlcore's megatron layers run unfused")),
        (tuple(TRANSFORMER + name for name in (*MOE_SETTINGS, *PIPELINE_SPLIT, "use_distributed_optimizer",
                                               "context_parallel_size")),
         None),  # mapped by the aliases above
        ((TRANSFORMER + "normalization",), VerlRefuse("the normalization is the model's own (RMSNorm)", ("RMSNorm",))),
        ((TRANSFORMER + "swiglu",), VerlRefuse("the MLP's activation is the model's own (SwiGLU)", (True,))),
        ((TRANSFORMER + "moe_enable_deepep",),
         VerlIgnore("tuning", "DeepEP's dispatch kernels; rlcore's megatron backend dispatches with megatron-core's "
                              "alltoall dispatcher (flex is read as alltoall): the same tokens reach the same "
                              "experts")),
        ((TRANSFORMER + "moe_grouped_gemm",),
         VerlIgnore("tuning", "one GEMM for all of a rank's experts needs TransformerEngine, which megatron-core's "
                              "local layer spec does without: each expert runs as its own MLP, with the same results")),
        ((TRANSFORMER + "moe_shared_expert_overlap",),
         VerlIgnore("tuning", "overlaps shared experts with the token exchange; the models rlcore builds (Qwen3-MoE) "
                              "have no shared experts")),
        ((TRANSFORMER + "moe_router_enable_expert_bias", TRANSFORMER + "moe_router_bias_update_rate"),
         VerlRefuse("aux-loss-free balancing (a learned per-expert bias) needs a sigmoid router (DeepSeek-V3's); the "
                    "Qwen3-MoE rlcore builds routes with a softmax: balance it with moe_aux_loss_coeff",
                    (False, None))),
        ((TRANSFORMER + "moe_*",), VerlRefuse(MOE_TAKEN, (None,))),
        ((TRANSFORMER + "context_parallel_algo", TRANSFORMER + "cp_partition_mode"),
         VerlIgnore("tuning", "how megatron-core's TransformerEngine attention exchanges and splits a sequence over "
                              "the context-parallel ranks; rlcore's context-parallel attention (an all-to-all of "
                              "heads, megatron-core's load-balanced chunks) computes the same attention")),
        ((TRANSFORMER + "deallocate_pipeline_outputs",),
         VerlIgnore("tuning", "memory: megatron-core frees a pipeline stage's output once sent; rlcore keeps it until "
                              "the backward pass, with the same results")),
        ((TRANSFORMER + "recompute_modules",),
         VerlRefuse("rlcore recomputes whole layers (recompute_granularity=full); selective recompute is " + NOT_YET,
                    (["core_attn"], None))),
        ((TRANSFORMER + "*",),
         VerlRefuse("rlcore builds megatron-core's TransformerConfig from the model; of verl's overrides it takes "
                    "recompute_granularity, recompute_method, recompute_num_layers, context_parallel_size, "
                    + ", ".join((*PIPELINE_SPLIT, *MOE_SETTINGS)),
                    (None,))),
        (("*.optim.override_optimizer_config.*",),
         VerlRefuse("rlcore's megatron optimizer takes only actor.optim.*, use_distributed_optimizer and the CPU "
                    "offload settings (optimizer_cpu_offload, optimizer_offload_fraction, "
                    "overlap_cpu_optimizer_d2h_h2d, use_precision_aware_optimizer)", (None,))),
    ),
    config_names=CONFIG_NAMES,
)
