"""The plugin API: the one core module a plugin imports from.

Every name a plugin package (a training backend, a rollout engine, a platform, an algorithm, a
tool, a CLI command) needs from the core is here, and only those; the rest of ``rlcore`` is internal
and free to change. ``tests/core/test_plugin_api.py`` fails when a plugin package imports anything
else from ``rlcore``.

Registration
    hookimpl                 marks a plugin's ``rlcore_register_<kind>(register)`` implementations
    setting                  a field of a plugin's config section (attrs), with its bounds and doc
    VerlKeys                 how verl's keys and values map onto a plugin's own settings
    VerlIgnore               a ``VerlKeys`` rule: a verl key ignored with a warning naming its category
    VerlRefuse               a ``VerlKeys`` rule: a verl key refused, saying what to use instead
    VerlTable                a ``VerlKeys`` table: verl keys under one prefix translated together
    JobCheck                 a plugin's checks of whole jobs (hook rlcore_register_job_checks)
    CheckedJob               what a job check reads: the config, the keys the job set, the plugins
Errors
    RlcoreError              the base of every error the CLI prints without a traceback (exit 2)
    ConfigError              a configuration problem, naming its TOML key
Roles (what the controller calls)
    Actor                    the policy being trained
    weight_buckets           named weights in buckets of a byte size (what weights_for_rollout yields)
    Reference                the frozen initial policy (log-probs for KL), or the distillation teacher
    Critic                   the value model
    Rollout                  a generation engine
    RolloutEngine            what an engine plugin registers: its builder and declared capabilities
    Reward                   what scores generated responses (``reward.kind``; hook rlcore_register_rewards)
    RewardResult             what a reward returns: per-response scores, extras, answers, metrics
    SamplingParams           what ``Rollout.generate`` samples with
    group_seed               the sampling seed of one generation group for a seeded call
Role specs (what a builder receives, computed by the driver; never the whole job)
    TrainingSpec             what every training role reads: its model, weights path, seed, the plugin tables
    TrainedSpec              what a trained role reads besides: optimizer, total steps, mini-batches, update plan
    ActorSpec                what a backend's actor builder receives
    ReferenceSpec            what a backend's reference builder receives
    CriticSpec               what a backend's critic builder receives
    RolloutSpec              what a rollout engine's builder receives
Training backends
    TrainingBackend          the ABC a training backend subclasses: role builders and capabilities
    ActorAlgorithms          the policy loss, KL estimator and distillation an actor gets from the driver
The batch
    Batch                    named tensors and per-row data passed between the controller and roles
    MULTI_MODAL_INPUTS       the per-row key of a vision-language model's image inputs (pixel values, grids)
    image_model_inputs       those rows' images as a Qwen2-VL-style forward takes them
    image_processor_file     a vision-language model's preprocessor_config.json (checkpoints copy it)
    is_vision_language       whether a Hugging Face config is a vision-language model's
    takes_token_types        whether a transformers function takes mm_token_type_ids (transformers 5)
    image_token_id           a vision-language model's image token (None for a text model)
    prompt_image_mask        the prompts' image tokens among a forward's ids (not a response's)
    images_in_prompts_only   a forward that puts the image features at those tokens only
    one_token_per_image      prompt ids with each image's tokens narrowed to one (engines that widen them)
    decode_image             encoded image bytes (a row's ``images``) as an RGB PIL image
Platforms (hardware)
    Platform                 the ABC a hardware platform subclasses
    CudaPlatform             the built-in CUDA platform, a base for platforms that answer torch.cuda
Tables a spec carries
    ModelConfig              ``[model]``: the policy's weights and LoRA settings
    CriticModelConfig        ``[critic.model]``: the value model's weights and LoRA settings
    OptimConfig              ``[actor.optim]`` / ``[critic.optim]``: optimizer and schedule settings
Algorithms (plugins that add estimators and losses)
    AdvantageEstimator       a registered advantage estimator and its declared needs
    AdvantageInputs          what an advantage estimator receives
    AdvantageOutputs         what an advantage estimator returns
    PolicyLoss               a registered policy loss and what it admits (clip range, aggregation)
    PolicyLossOutput         what a policy loss returns
    agg_loss                 reduces per-token losses to one, by the job's loss_agg_mode
Helpers training backends share
    micro_batch_actor_loss   the actor's loss (policy loss, entropy, KL) on one micro-batch
    entropy_in_loss          whether the entropy term takes part in the actor's gradient
    critic_loss              the clipped value loss on one micro-batch
    explained_variance       the critic's explained variance, for metrics
    token_log_probs          fp32 log-probs of target tokens from logits at a sampling temperature
    sum_pi_squared_from_logits  sum of the squared probabilities per position (actor.calculate_sum_pi_squared)
    MicroBatchPlan           a pass's micro-batching in a spec: rows or a token budget per micro-batch
    mini_batch_rows          rows of one mini-batch per data-parallel rank (prompts x n / ranks)
    loss_weights             each micro-batch's factor for its loss, by the job's loss_agg_mode
    LrSchedule               the learning-rate schedule (warmup, decay over the job's steps)
    Timer                    named wall-clock phases, reported as timing metrics
    role_metric_name         a training role's metric name (<role>/<key>, or a key that names its own group)
    read_metrics             a step's metrics as numbers: the losses' 0-d device tensors read in one copy
    to_device                a micro-batch's host tensor on the device, through pinned memory, the host not waiting
    load_causal_lm           a Hugging Face causal LM, from a local folder or the embedded model
    load_model_config        its Hugging Face config as rlcore trains it (overrides applied, dropout off)
    load_value_model         a causal LM with a one-output value head
    quiet_loading            a block where transformers' weight-loading progress bars stay hidden
    load_tokenizer           the tokenizer of a model folder
    policy_tokenizer         the [model] table's tokenizer, loaded once per process (for checkpoints)
    resolve_dtype            a ``model.dtype`` name as a torch dtype on a platform
    resolve_model_path       a model path, hub id or embedded name as a local folder
    write_peft_adapter       a PEFT adapter folder's two files (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
    ADAPTER_CONFIG           its config file's name, adapter_config.json
    ADAPTER_WEIGHTS          its tensors' file name, adapter_model.safetensors
    top_k_log_probs          the teacher's side of that loss: its top-k log-probs and ids from logits
    student_top_k            the student's side: its log-probs at the teacher's ids, and the overlap
    StudentTopK              what the actor hands micro_batch_actor_loss for that loss
    TOP_K_COLUMNS            the batch columns the teacher adds for it (ref_topk_ids, ref_topk_log_probs)
    ModelRouting             record or replay a mixture of experts' routing (actor.router_replay)
    tokens_of                the routed_experts column (B, T, L, K) -> a forward's token order (N, L, K)
    column_of                a forward's (N, L, K) routing -> the routed_experts column
    recorded_tokens          the (N, L, K) routing of one recorded forward
Distributed helpers
    ensure_process_group     join the worker's process group (or make a one-rank one)
    local_device             this rank's device on a platform
    rank                     this process's rank (0 without a process group)
    world_size               the number of ranks (1 without a process group)
    on_rank0                 run an action on rank 0, re-raising its failure on every rank
    write_folder             a folder every rank writes into, appearing only when complete
    all_to_all               scatter one dimension over a group and gather another, with gradients (Ulysses)
Checkpoints and folders
    CheckpointManager        the run's global_step_N checkpoint folders: saving, finding, retention
    MANIFEST                 the name of a checkpoint's file of checksums
    verified                 a checkpoint folder, or an error naming its damaged file
    staging_dir              a hidden sibling folder to write into before publishing
    publish                  move a staged folder into place atomically
    recover_directory        put back a folder a crash left aside while it was being replaced
Helpers rollout engines share
    ROLLOUT_TIMING           the batch-meta key of the engine's timing phases
    prompt_tensors           a batch's left-padded prompt ids and attention mask
    group_leader             the global rank that stands for a generation group (its lowest)
    pool_rows                the prompt rows of every rank of a generation group, in rank order
    pool_objects             per-row values (a row's images) of every rank of a generation group, the same order
    unpadded                 token lists without padding
    response_rows            the rollout's output batch from prompts and generated tokens
    eos_token_ids            the token ids that end a response, for a model folder
Agents, tools and commands
    Agent                    an agent program a plugin registers (hook rlcore_register_agents)
    Episode                  what an agent receives: the dataset row and its endpoint's base_url and api_key
    Tool                     a tool a model may call in a multi-turn rollout
    ToolResult               what a tool call returns
    CALCULATOR               the built-in calculator tool (its execute evaluates arithmetic, never with eval)
    Command                  an ``rlcore`` subcommand a plugin registers
"""

from rlcore.agents import Agent, Episode
from rlcore.algorithms import AdvantageEstimator, AdvantageInputs, AdvantageOutputs, PolicyLossOutput, agg_loss
from rlcore.algorithms.aggregation import loss_weights
from rlcore.algorithms.distillation import TOP_K_COLUMNS, StudentTopK, student_top_k, top_k_log_probs
from rlcore.algorithms.entropy import sum_pi_squared_from_logits, token_log_probs
from rlcore.algorithms.objective import critic_loss, entropy_in_loss, micro_batch_actor_loss
from rlcore.algorithms.policy_losses import PolicyLoss
from rlcore.algorithms.value import explained_variance
from rlcore.batch import Batch, mini_batch_rows
from rlcore.cli import Command
from rlcore.config.schema import CriticModelConfig, ModelConfig, OptimConfig
from rlcore.data.images import decode as decode_image
from rlcore.data.vision import (
    MULTI_MODAL_INPUTS,
    image_model_inputs,
    image_processor_file,
    image_token_id,
    images_in_prompts_only,
    one_token_per_image,
    prompt_image_mask,
    takes_token_types,
)
from rlcore.errors import ConfigError, RlcoreError
from rlcore.metrics.step import Timer, read_metrics, role_metric_name
from rlcore.models.loading import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    is_vision_language,
    load_causal_lm,
    load_model_config,
    load_tokenizer,
    policy_tokenizer,
    load_value_model,
    quiet_loading,
    resolve_dtype,
    resolve_model_path,
    write_peft_adapter,
)
from rlcore.models.routing import ModelRouting, column_of, recorded_tokens, tokens_of
from rlcore.plugins.hookspecs import hookimpl
from rlcore.plugins.settings import CheckedJob, JobCheck, VerlKeys, VerlTable, setting
from rlcore.plugins.settings import Ignore as VerlIgnore
from rlcore.plugins.settings import Refuse as VerlRefuse
from rlcore.rewards.scorer import RewardResult
from rlcore.rollout.declared import RolloutEngine
from rlcore.rollout.outputs import (
    ROLLOUT_TIMING,
    eos_token_ids,
    group_leader,
    pool_objects,
    pool_rows,
    prompt_tensors,
    response_rows,
    unpadded,
)
from rlcore.runs.checkpoint import MANIFEST, CheckpointManager, verified
from rlcore.runtime.atomic import publish, recover_directory, staging_dir
from rlcore.runtime.distributed import (
    all_to_all,
    ensure_process_group,
    local_device,
    on_rank0,
    rank,
    world_size,
    write_folder,
)
from rlcore.runtime.platforms import CudaPlatform, Platform
from rlcore.runtime.transfer import to_device
from rlcore.tools import Tool, ToolResult
from rlcore.tools.calculator import CALCULATOR
from rlcore.training.backends import ActorAlgorithms, TrainingBackend
from rlcore.training.lr_schedule import LrSchedule
from rlcore.training.micro_batching import MicroBatchPlan
from rlcore.training.roles import (
    Actor,
    Critic,
    Reference,
    Reward,
    Rollout,
    SamplingParams,
    group_seed,
    weight_buckets,
)
from rlcore.training.specs import ActorSpec, CriticSpec, ReferenceSpec, RolloutSpec, TrainedSpec, TrainingSpec

__all__ = [
    # registration
    "hookimpl", "setting", "VerlKeys", "VerlIgnore", "VerlRefuse", "VerlTable", "JobCheck", "CheckedJob",
    # errors
    "RlcoreError", "ConfigError",
    # roles
    "Actor", "Reference", "Critic", "Rollout", "RolloutEngine", "Reward", "RewardResult", "SamplingParams", "group_seed",
    "weight_buckets",
    # role specs
    "TrainingSpec", "TrainedSpec", "ActorSpec", "ReferenceSpec", "CriticSpec", "RolloutSpec",
    # training backends
    "TrainingBackend", "ActorAlgorithms",
    # the batch
    "Batch",
    # images in the batch (a vision-language model's rows)
    "MULTI_MODAL_INPUTS", "image_model_inputs", "image_processor_file", "is_vision_language", "takes_token_types",
    "image_token_id", "one_token_per_image", "decode_image", "prompt_image_mask", "images_in_prompts_only",
    # platforms
    "Platform", "CudaPlatform",
    # tables a spec carries
    "ModelConfig", "CriticModelConfig", "OptimConfig",
    # algorithms
    "AdvantageEstimator", "AdvantageInputs", "AdvantageOutputs", "PolicyLoss", "PolicyLossOutput", "agg_loss",
    # helpers training backends share
    "micro_batch_actor_loss", "entropy_in_loss", "critic_loss", "explained_variance", "token_log_probs",
    "sum_pi_squared_from_logits",
    "MicroBatchPlan", "mini_batch_rows", "loss_weights", "LrSchedule", "Timer", "read_metrics", "role_metric_name",
    "to_device",
    "load_causal_lm", "load_model_config", "load_value_model", "load_tokenizer", "policy_tokenizer", "resolve_dtype",
    "resolve_model_path", "quiet_loading",
    "ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "write_peft_adapter",
    "top_k_log_probs", "student_top_k",
    "StudentTopK", "TOP_K_COLUMNS", "ModelRouting", "tokens_of", "column_of", "recorded_tokens",
    # distributed helpers
    "ensure_process_group", "local_device", "rank", "world_size", "on_rank0", "write_folder", "all_to_all",
    # checkpoints and folders
    "CheckpointManager", "MANIFEST", "verified", "staging_dir", "publish", "recover_directory",
    # helpers rollout engines share
    "ROLLOUT_TIMING", "prompt_tensors", "group_leader", "pool_rows", "pool_objects", "unpadded", "response_rows", "eos_token_ids",
    # agents, tools and commands
    "Agent", "Episode", "Tool", "ToolResult", "CALCULATOR", "Command",
]
