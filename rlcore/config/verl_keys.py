"""verl's keys that rlcore does not simply map (those are ``overrides.VERL_KEYS`` and the plugins'
``VerlKeys.aliases``): keys it ignores, each with a named category, keys it refuses with what to use
instead, and the few whose values are translated (the reward manager's name; verl's
``algorithm.rollout_correction.*`` is translated beside rollout correction, in
``rlcore.algorithms.rollout_correction``). The rules for a plugin's own tables are the plugin's (``VerlKeys.rules``).

Every leaf key of verl's generated trainer configs falls into one of: mapped onto an rlcore setting,
implemented here, ignored (category below), refused. ``tests/core/test_verl_key_inventory.py`` holds
that list of keys and checks it.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from rlcore.plugins.settings import Ignore, Refuse, Rule  # noqa: F401 - declared on the floor, with VerlKeys

# Why a verl key may be ignored; a warning names the category of each key it ignores.
CATEGORIES = {
    "profiler": "profiler settings (rlcore's own: profiler.steps traces those steps with torch's profiler in every "
                "worker process, docs/profiling.md)",
    "machinery": "machinery rlcore does not have (its single controller runs synchronous hybrid workers)",
    "tuning": "speed or memory tuning rlcore does not have; the results are the same without it",
    "derived": "rlcore derives it from other settings",
    "other-engines": "settings of verl engines rlcore does not have, or whose own settings it does not map (trtllm, ...)",
    "feature-off": "a setting of a feature rlcore does not have; that feature's switch is refused",
    "as-rlcore": "set to what rlcore does anyway",
}


def _refuse_unless_default(*values: Any, instead: str) -> Refuse:
    return Refuse(instead, values)


NOT_YET = "not implemented in rlcore yet"
OWN_ROUTING = ("rlcore's reference and critic keep their own routing; router replay is the actor's "
               "(actor_rollout_ref.actor.router_replay.mode, actor.router_replay)")
ROUTING_FILES = ("routing to/from a file is not implemented: R2 records in the old log-prob pass and R3 takes the "
                 "rollout's choices, both in the batch (actor.router_replay, docs/router-replay.md)")
VISION = ("rlcore's vision-language training takes images only (not videos or audio), with the model folder's own "
          "image processor settings, and trains the whole model or the language model with actor.freeze_vision_tower "
          "(docs/multimodal.md)")
TRAINER_SEED = "set trainer.seed"

# Rules several tables share, with the plugins' rules for their own tables (rlcore.api.VerlKeys).
OTHER_ENGINE = Ignore("other-engines", "read only by a verl engine rlcore does not have (`rlcore plugins` lists the "
                                       "installed backends and engines)")
FROZEN_REFERENCE = Ignore("machinery", "the reference is frozen: no optimizer, no backward pass to recompute for")
MACHINERY = Ignore("machinery", "rlcore's workers, data loading and checkpoints work without it")
TUNING = Ignore("tuning", "rlcore runs without it")
DERIVED = Ignore("derived", "from model.* (the critic reads the actor's tokens), trainer.seed, rollout.n, "
                            "data.max_*_length, actor.shuffle, the backend or the estimator")

# (glob patterns on the verl key, what to do): the core's own, after the plugins' (``VerlKeys.rules``).
# The first match wins; a rule of None: the key is mapped.
RULES: tuple[Rule, ...] = (
    # --- profilers
    (("*.profiler.*", "global_profiler.*", "ray_kwargs.timeline_json_file"),
     Ignore("profiler", "verl's profiler tables and tools; set profiler.steps (and profiler.dir) for rlcore's")),
    # --- verl's other engines: only read when their strategy is chosen, which rlcore refuses
    # (the tables of verl's other training engines: the training backend plugins own them)
    (("actor_rollout_ref.rollout.engine_kwargs.trtllm", "actor_rollout_ref.rollout.engine_kwargs.trtllm.*"),
     OTHER_ENGINE),
    # --- features rlcore does not have: the switch is refused, the rest ignored
    (("transfer_queue.enable",), Refuse("rlcore moves batches through its worker groups", (False,))),
    (("transfer_queue.*",), Ignore("feature-off", "verl's transfer queue (transfer_queue.enable is refused)")),
    (("skip.*.enable",), Refuse("replaying dumped rollouts is " + NOT_YET, (False,))),
    (("skip.*",), Ignore("feature-off", "replaying dumped rollouts (skip.*.enable is refused)")),
    (("*.qat.enable",), Refuse("quantization-aware training is " + NOT_YET, (False,))),
    (("*.qat.*", "actor_rollout_ref.rollout.qat"), Ignore("feature-off", "quantization-aware training")),
    (("*.mtp.enable", "*.mtp.enable_rollout", "*.mtp.enable_train"),
     Refuse("multi-token prediction is " + NOT_YET, (False,))),
    (("*.mtp.*", "actor_rollout_ref.rollout.mtp"), Ignore("feature-off", "multi-token prediction")),
    (("*.disaggregation.enabled",), Refuse("prefill/decode disaggregation is " + NOT_YET, (False,))),
    (("*.disaggregation.*",), Ignore("feature-off", "prefill/decode disaggregation")),
    # router replay: the actor's mode is mapped (disabled -> off, R2, R3); a training backend's own spelling
    # of it (under its engine table) is that plugin's to map
    (("actor_rollout_ref.actor.router_replay.mode",), None),
    (("*.router_replay.record_file", "*.router_replay.replay_file"), Refuse(ROUTING_FILES, (None,))),
    (("*.router_replay.mode",), Refuse(OWN_ROUTING, ("disabled",))),
    (("*.tiled_mlp.enabled",), Ignore("tuning", "tiled MLP computation")),
    (("*.tiled_mlp.*",), Ignore("tuning", "tiled MLP computation")),
    (("reward.sandbox_fusion.url", "sandbox_fusion.url"),
     Refuse("sandboxed code execution rewards are " + NOT_YET + "; score with reward.custom_reward_function", (None,))),
    (("reward.sandbox_fusion.*", "sandbox_fusion.*"), Ignore("feature-off", "sandbox fusion (its url is refused)")),
    (("trainer.v1.trainer_mode",), Refuse("rlcore's trainer is synchronous", ("sync",))),
    (("trainer.v1.*", "trainer.use_v1"), Ignore("machinery", "verl's v1 trainer modes")),
    # --- verl's reward-model server (rlcore scores with a sequence classifier in its workers)
    (("reward.reward_model.rollout.*", "reward_model.rollout.*", "reward.reward_model.enable_resource_pool",
      "reward.reward_model.n_gpus_per_node", "reward.reward_model.nnodes", "reward_model.enable_resource_pool",
      "reward_model.n_gpus_per_node", "reward_model.nnodes"),
     Ignore("machinery", "a reward model runs in rlcore's training workers, not an inference server of its own")),
    (("reward.reward_manager.source", "reward_model.reward_loop_source"),
     Refuse("register a reward function through a plugin or set reward.custom_reward_function", ("register", None))),
    (("reward.reward_manager.module.*", "reward_model.reward_loop_module_path", "reward_model.reward_loop_class_name"),
     Refuse("register a reward function through a plugin or set reward.custom_reward_function",
            (None, "custom_reward_manager"))),
    # verl's reward.num_workers is rlcore's own reward.num_workers (the reward worker pool): mapped as it is
    (("reward_model.num_workers",),
     Ignore("machinery", "a reward model runs in rlcore's training workers, not in a pool of its own")),
    (("*.external_lib",), Refuse("install a plugin that registers the model or reward (rlcore plugins)", (None,))),
    (("actor_rollout_ref.ref.optim.*",), FROZEN_REFERENCE),
    # --- machinery rlcore does not have
    (("hydra.*",), Ignore("machinery", "Hydra's own settings (rlcore reads TOML and overrides)")),
    (("data.dataloader_num_workers", "data.use_shm", "data.filter_overlong_prompts_workers", "data.custom_cls.*",
      "*.use_shm", "*.nccl_timeout", "actor_rollout_ref.hybrid_engine", "actor_rollout_ref.rollout.mode",
      "actor_rollout_ref.rollout.layered_summon", "actor_rollout_ref.rollout.agent.*",
      "actor_rollout_ref.rollout.checkpoint_engine.*", "actor_rollout_ref.rollout.prometheus.*",
      "actor_rollout_ref.rollout.trace.*", "actor_rollout_ref.rollout.moe_load_balance_metrics_interval",
      "actor_rollout_ref.rollout.disable_log_stats", "*.forward_only", "*.data_loader_seed",
      "trainer.ray_wait_register_center_timeout", "trainer.device", "trainer.esi_redundant_time",
      "trainer.default_hdfs_dir", "trainer.del_local_ckpt_after_load", "ray_kwargs.*",
      "*.checkpoint.mbridge_config", "*.checkpoint.strict",
      "actor_rollout_ref.actor.optim.use_checkpoint_opt_param_scheduler", "critic.optim.use_checkpoint_opt_param_scheduler",
      "data.return_raw_input_ids", "data.return_full_prompt", "data.return_multi_modal_inputs", "data.return_raw_chat",
      "data.reward_fn_key", "data.validation_shuffle", "data.trust_remote_code", "data.tokenizer",
      "trainer.use_legacy_worker_impl",
      "*.skip_tokenizer_init", "*.scheduling_policy"),
     MACHINERY),
    # --- torch.compile: the actor's layers (actor.use_torch_compile, mapped); the reference follows it
    (("actor_rollout_ref.actor.use_torch_compile",), None),
    (("actor_rollout_ref.ref.use_torch_compile",),
     Ignore("derived", "the reference's layers are compiled when actor.use_torch_compile is set")),
    # --- speed and memory tuning (same results)
    (("*.use_torch_compile", "*.entropy_checkpointing", "*.entropy_from_logits_*", "*.use_fused_kernels",
      "*.fused_kernel_options.*", "*.use_liger", "*.forward_prefetch", "*.pad_to_length", "*.pad_to_length_bucket",
      "*.wrap_policy.*", "*.use_orig_params", "*.cudagraph_capture_sizes", "*.enable_activation_offload",
      "*.multi_stage_wake_up", "*.offload_policy", "actor_rollout_ref.actor.use_prefix_grouper"),
     TUNING),
    # --- derived from other settings
    (("*.rollout_n", "actor_rollout_ref.rollout.prompt_length", "actor_rollout_ref.rollout.response_length",
      "actor_rollout_ref.rollout.n_gpus_per_node", "actor_rollout_ref.rollout.dtype",
      "actor_rollout_ref.actor.calculate_entropy", "*.optim.total_training_steps", "*.optim.zero_indexed_step",
      "critic.enable", "critic.model.tokenizer_path", "critic.model.trust_remote_code",
      "critic.model.use_remove_padding", "critic.shuffle"),
     DERIVED),
    # --- refused unless set to what rlcore does anyway
    (("actor_rollout_ref.rollout.pipeline_model_parallel_size",),
     Refuse("the rollout splits a model by tensor, data and expert parallelism (rollout.tensor_model_parallel_size, "
            "data_parallel_size, expert_parallel_size), not by pipeline stages", (1,))),
    (("*.full_determinism",), Refuse("deterministic kernels are " + NOT_YET, (False,))),
    (("*.checkpoint.async_save",), Refuse("checkpoints are written synchronously", (False,))),
    (("*.ppo_micro_batch_size", "*.log_prob_micro_batch_size", "critic.forward_micro_batch_size"),
     Refuse("use the per-GPU spelling (ppo_micro_batch_size_per_gpu, log_prob_micro_batch_size_per_gpu)", (None,))),
    (("critic.forward_micro_batch_size_per_gpu",), Refuse("use critic.ppo_micro_batch_size_per_gpu", (None,))),
    (("*.loss_scale_factor",), Refuse("loss scaling is set by actor.loss_agg_mode", (None,))),
    (("data.image_patch_size",),
     Ignore("feature-off", "the patch size of a vision processor; rlcore reads it from the model folder's "
                           "preprocessor_config.json (" + VISION + ")")),
    (("actor_rollout_ref.actor.freeze_vision_tower",), None),
    (("data.video_key", "data.audio_key",
      "data.mm_processor_kwargs", "*.limit_images", "*.lora.freeze_vision_model",
      "*.lora.freeze_vision_projection"),
     Refuse(VISION, (False, "videos", "audios", {}, None, True))),
    (("actor_rollout_ref.actor.policy_loss.dro_beta",), Refuse("the DRO loss is " + NOT_YET, (None,))),
    (("*.optim.name", "*.optim.optimizer"), Refuse("rlcore trains with AdamW", ("AdamW", "adam", "AdamW"))),
    (("*.optim.optimizer_impl",), Refuse("rlcore trains with torch.optim.AdamW", ("torch.optim",))),
    (("*.optim.override_optimizer_config",), Refuse(NOT_YET, (None, {}))),
    (("*.optim.muon_*",), Ignore("feature-off", "the Muon optimizer (optim.name is refused unless AdamW)")),
    (("*.optim.exp_avg_dtype", "*.optim.exp_avg_sq_dtype", "*.optim.main_grads_dtype"),
     Refuse("optimizer states are kept in fp32", ("fp32",))),
    (("*.optim.use_precision_aware_optimizer", "*.optim.use_layer_wise_distributed_optimizer"),
     Refuse(NOT_YET, (False,))),
    (("*.optim.min_lr",), None),  # the cosine floor as a learning rate: optim.min_lr
    (("*.optim.lr_warmup_init", "*.optim.lr_start", "*.optim.lr_min", "*.optim.min_lr_factor"),
     Refuse("the schedule starts from 0 and ends at optim.min_lr_ratio x lr: set actor.optim.min_lr_ratio", (0.0, 0))),
    (("*.optim.lr_decay_steps", "*.optim.lr_wsd_decay_steps"),
     Refuse("the schedule spans trainer.total_training_steps", (None,))),
    (("*.optim.lr_decay_ratio",), Refuse("the schedule spans trainer.total_training_steps", (1.0,))),
    (("*.optim.weight_decay_incr_style",), Refuse("weight decay is constant", ("constant",))),
    (("*.optim.lr_wsd_decay_style",), Refuse("use actor.optim.lr_scheduler (constant or cosine)", ("exponential",))),
    (("*.optim.decay_type",), Refuse("use actor.optim.lr_scheduler (constant or cosine)", ("linear",))),
    (("*.model.exclude_modules",), None),  # model.lora_exclude_modules: PEFT's regular expression
    (("*.model.custom_chat_template", "*.model.hf_config_path",
      "critic.model.lora_adapter_path", "critic.model.lora.adapter_path"),
     Refuse("rlcore uses the model folder's own config and chat template and starts adapters fresh", (None, {}))),
    (tuple(f"{table}.reward_kwargs.overlong_buffer_cfg.{name}" for table in ("reward", "reward_model")
           for name in ("enable", "len", "penalty_factor")), None),  # mapped onto reward.overlong_buffer.*
    (("reward.reward_kwargs.overlong_buffer_cfg.log", "reward_model.reward_kwargs.overlong_buffer_cfg.log",
      "reward.reward_kwargs.max_resp_len", "reward_model.reward_kwargs.max_resp_len"),
     Ignore("derived", "the overlong penalty logs its metrics and reads data.max_response_length")),
    (("reward.reward_kwargs.*", "reward_model.reward_kwargs.*", "reward.reward_kwargs", "reward_model.reward_kwargs"),
     Refuse("set reward.overlong_buffer.* (DAPO's overlong penalty) or read arguments in your compute_score",
            (None, {}))),
    # actor_rollout_ref.model.override_config(.*) is mapped: model.override_config
    (("actor_rollout_ref.model.override_config", "actor_rollout_ref.model.override_config.*"), None),
    (("*.model.override_config", "*.model.override_config.*"),
     Refuse("edit the critic model folder's config.json (model.override_config sets the policy's config)",
            ({}, None))),
    (("*.lora.dropout",), Refuse("LoRA adapters have no dropout in rlcore", (0.0, 0))),
    (("*.lora.type",), Refuse("rlcore's adapters are plain LoRA", ("lora",))),
    (("*.lora.merge",), Refuse("rlcore always merges LoRA adapters into the weights it hands the rollout "
                               "(what lora.merge=True does; with False verl sends the adapters, same outputs)",
                               (False, True))),
    (("*.lora.a2a_experimental",), Refuse(NOT_YET, (False,))),
    (("*.lora.freeze_language_model",), Refuse(VISION, (True,))),
    (("*.lora.dropout_position", "*.lora.lora_A_init_method", "*.lora.lora_B_init_method", "*.lora.dtype",
      "*.lora.exclude_modules"),
     Refuse("rlcore's LoRA starts A random (kaiming) and B at zero, in the model's dtype",
            ("pre", "xavier", "kaiming", "zero", None, []))),
    (("actor_rollout_ref.rollout.ignore_eos",), Refuse("responses end at the eos token", (False,))),
    (("actor_rollout_ref.rollout.over_sample_rate",), Refuse(NOT_YET, (0, 0.0))),
    (("actor_rollout_ref.rollout.nnodes",), Refuse("in lockstep the rollout shares the actor's workers; a rollout pool of "
                                                   "its own is async_training.mode = 'split' with "
                                                   "async_training.rollout_nnodes (docs/async.md)", (0,))),
    # rollout.quantization is mapped (the inference engine's quantization method)
    (("actor_rollout_ref.rollout.quantization_config_file",),
     Refuse("set the method in rollout.quantization; other quantization options go in the engine's own "
            "engine_kwargs (rollout.<engine>.engine_kwargs)", (None,))),
    (("data.train_max_samples", "data.val_max_samples"), Refuse("cut the parquet file", (-1,))),
    (("data.gen_batch_size",), Refuse("rlcore generates data.train_batch_size prompts per step", (None,))),
    (("algorithm.filter_groups.max_inflight_gen_batches",), Refuse(NOT_YET, (1,))),
    (("*.checkpoint.save_contents",), None),  # [actor.checkpoint], [critic.checkpoint]
    (("*.checkpoint.load_contents",),
     Refuse("rlcore loads what a checkpoint holds (set actor.checkpoint.save_contents, critic.checkpoint."
            "save_contents); a checkpoint without the optimizer resumes with a fresh one",
            (["model", "optimizer", "extra"], ["model", "optimizer", "extra", "hf_model"], "${.save_contents}"))),
)


def rule_for(key: str, plugin_rules: tuple[Rule, ...] = ()) -> Ignore | Refuse | None:
    """The rule for a verl key, the plugins' rules first, or None when it is mapped (or unknown)."""
    for patterns, rule in (*plugin_rules, *RULES):
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns):
            return rule
    return None


# verl's reward managers: the ones whose scores rlcore's per-sample reward gives as they are.
REWARD_MANAGERS = {
    "naive": "compute_score is called once per sample, as rlcore does",
    "dapo": "per-sample compute_score; the overlong penalty is reward.overlong_buffer, as in verl",
    "prime": "per-sample compute_score (verl runs it in a process pool; the scores are the same)",
    "gdpo": "per-sample compute_score; the other keys of the dict it returns stay in the batch per sample, where "
            "adv_estimator gdpo reads algorithm.gdpo_reward_keys",
}
REWARD_MANAGER_KEYS = ("reward.reward_manager.name", "reward_model.reward_manager")
# verl's logger names for what rlcore does in every run: dropped from trainer.logger with a warning
BUILT_IN_LOGGERS = {"file": "every rlcore run writes metrics.jsonl in its run folder (verl's file logger's JSONL)"}

# verl's policy losses whose loss it aggregates per sequence whatever loss_agg_mode says; given one
# (and no loss_agg_mode), rlcore sets actor.loss_agg_mode, which those losses require
SEQUENCE_AGGREGATED_LOSSES = ("sapo", "geo_mean")
BATCH_REWARD_MANAGER = "batch"  # compute_score takes lists: reward.custom_reward_function.batch

# Older (v0.6.0) verl names and today's: both work; the old one gets a note naming the new one.
RENAMED = {
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.model.path": "reward.reward_model.model_path",
    "actor_rollout_ref.model.lora_rank": "actor_rollout_ref.model.lora.rank",
    "actor_rollout_ref.model.lora_alpha": "actor_rollout_ref.model.lora.alpha",
    "actor_rollout_ref.model.target_modules": "actor_rollout_ref.model.lora.target_modules",
    "critic.model.lora_rank": "critic.model.lora.rank",
    "critic.model.lora_alpha": "critic.model.lora.alpha",
    "critic.model.target_modules": "critic.model.lora.target_modules",
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
    **{f"algorithm.rollout_is{suffix}": f"algorithm.rollout_correction.{new}" for suffix, new in (
        ("", "rollout_is (a level: token or sequence)"), ("_threshold", "rollout_is_threshold"),
        ("_threshold_lower", "rollout_is_threshold as 'lower_upper'"), ("_level", "rollout_is"),
        ("_mode", "rollout_rs"), ("_veto_threshold", "rollout_rs"))},
}

TEACHER_MODELS = "distillation.teacher_models."  # verl's teachers by name; its one default is DEFAULT_TEACHER
DEFAULT_TEACHER = "teacher_model"
