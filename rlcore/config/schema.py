"""The job configuration: one frozen attrs class per TOML table. Defaults follow verl's.

docs/config-reference.md is generated from this file (python -m rlcore.config.reference); every field's
``doc`` says what it does.
"""

from typing import Any

import attrs

from rlcore.algorithms.config import AlgorithmConfig, FilterGroups, KlControl  # noqa: F401 - the [algorithm] table
from rlcore.algorithms.distillation import DistillationConfig
from rlcore.data.config import DataConfig
from rlcore.models.loading import EMBEDDED_MODEL
from rlcore.plugins.settings import setting
from rlcore.rewards.config import RewardConfig
from rlcore.rollout.config import RolloutConfig


@attrs.frozen
class ModelConfig:
    path: str = setting(EMBEDDED_MODEL, doc="Hugging Face folder, hub id, or the embedded SmolLM2 name")
    tokenizer_path: str | None = setting(None, doc="tokenizer folder or id (default: model.path)")
    dtype: str = setting("auto", choices=("auto", "float32", "bfloat16", "float16"),
                         doc="auto: the platform's (fp32 on CPU, bf16 on GPU)")
    enable_gradient_checkpointing: bool = setting(False, doc="recompute activations in backward")
    use_remove_padding: bool = setting(False, doc="pack variable-length samples instead of padding")
    trust_remote_code: bool = setting(False, doc="allow model code from the model folder")
    lora_rank: int = setting(0, ge=0, doc="LoRA adapters of this rank on the actor (0: train all weights)")
    lora_alpha: float = setting(16.0, gt=0.0, doc="LoRA scale numerator: adapters add lora_alpha / lora_rank * B A")
    target_modules: tuple[str, ...] = setting(("all-linear",), doc="linear layers given adapters, by name "
                                                                   "(q_proj, ...), or all-linear")
    lora_exclude_modules: str | None = setting(
        None, doc="a regular expression: targeted linear layers whose full name matches it get no adapter "
                  "(PEFT's and verl's exclude_modules, e.g. '.*visual.*')")
    lora_adapter_path: str | None = setting(
        None, doc="a PEFT LoRA adapter folder the actor's adapters start from (backends that train LoRA); its "
                  "rank, alpha and target modules are the adapter's")
    override_config: dict[str, Any] = setting(
        factory=dict, doc="Hugging Face config values set over the model folder's config.json for the actor, the "
                          "reference (not a distillation teacher) and the inference engine, e.g. "
                          "{max_position_embeddings = 32768}; a table sets attributes of a sub-config "
                          "(text_config = {...}); a backend that declares it (verl's model.override_config)")


@attrs.frozen
class OptimConfig:
    lr: float = setting(1e-6, gt=0.0, doc="AdamW learning rate")
    weight_decay: float = setting(0.01, ge=0.0)
    betas: tuple[float, float] = setting((0.9, 0.999), doc="AdamW betas")
    eps: float = setting(1e-8, gt=0.0, doc="AdamW epsilon (added to the root of the second moment)")
    warmup_steps: int = setting(-1, ge=-1, doc="linear warmup steps; -1: use warmup_steps_ratio")
    warmup_steps_ratio: float = setting(0.0, ge=0.0, le=1.0, doc="warmup as a fraction of all steps")
    lr_scheduler: str = setting("constant", choices=("constant", "cosine"))
    num_cycles: float = setting(0.5, gt=0.0, doc="cosine: waves of the cosine over the steps after warmup (0.5, verl's "
                                                 "default: one half-wave from lr down to the floor; 1: down and back "
                                                 "up to lr)")
    min_lr_ratio: float = setting(0.0, ge=0.0, le=1.0, doc="cosine floor as a fraction of lr")
    min_lr: float | None = setting(None, ge=0.0, doc="cosine floor as a learning rate (verl's optim.min_lr); "
                                                   "set, it takes min_lr_ratio's place")
    grad_clip: float = setting(1.0, gt=0.0, doc="max global gradient norm")


@attrs.frozen
class CheckpointContents:
    save_contents: tuple[str, ...] = setting(
        ("model", "optimizer", "extra"),
        doc="what a checkpoint of the role holds (verl's names): model (the weights, needed to resume), optimizer "
            "(Adam's state; without it a resume starts a fresh optimizer, with a warning), extra (the learning-rate "
            "schedule's position, a few bytes rlcore always writes); hf_model is accepted: every checkpoint holds "
            "the Hugging Face config and tokenizer, and `rlcore export` writes the weights from it")


@attrs.frozen
class ActorConfig:
    ppo_mini_batch_size: int = setting(256, ge=1, doc="prompts per optimizer step (times rollout.n samples)")
    ppo_micro_batch_size_per_gpu: int | None = setting(
        None, ge=1, doc="samples per forward/backward; None: the whole mini-batch share of a worker")
    use_dynamic_bsz: bool = setting(False, doc="form micro-batches by token budget")
    ppo_max_token_len_per_gpu: int = setting(16384, ge=1, doc="token budget per micro-batch")
    ppo_epochs: int = setting(1, ge=1, doc="passes over each batch")
    shuffle: bool = setting(False, doc="shuffle samples between mini-batches")
    reuse_on_policy_log_probs: bool = setting(
        True, doc="when the update is on-policy (ppo_epochs = 1, one mini-batch per step, no KL in the reward, "
                  "rollout IS only with truncated weights and no rejection or batch normalisation), take the old "
                  "log-probs from the update's own forward pass instead of a separate one, and weigh each "
                  "micro-batch's rollout IS against them: the same values, one forward pass fewer per step")
    policy_loss: str = setting("vanilla", doc="registered policy loss (verl: policy_loss.loss_mode)")
    clip_ratio: float = setting(0.2, ge=0.0, doc="PPO clip range (dppo_tv, dppo_kl: the divergence threshold)")
    clip_ratio_low: float | None = setting(None, ge=0.0, doc="lower clip range (default: clip_ratio)")
    clip_ratio_high: float | None = setting(None, ge=0.0, doc="upper clip range, DAPO clip-higher")
    clip_ratio_c: float = setting(3.0, gt=1.0, doc="dual-clip constant for negative advantages (dppo_tv, "
                                                   "dppo_kl: the importance ratio's truncation)")
    clip_cov_ratio: float = setting(0.0002, ge=0.0, doc="clip_cov: fraction of tokens clipped")
    clip_cov_lb: float = setting(1.0, doc="clip_cov: covariance lower bound")
    clip_cov_ub: float = setting(5.0, doc="clip_cov: covariance upper bound")
    kl_cov_ratio: float = setting(0.0002, ge=0.0, doc="kl_cov: fraction of tokens penalised")
    ppo_kl_coef: float = setting(0.1, ge=0.0, doc="kl_cov: penalty coefficient")
    tau_pos: float = setting(1.0, gt=0.0, doc="sapo: gate temperature of tokens with a positive advantage")
    tau_neg: float = setting(1.05, gt=0.0, doc="sapo: gate temperature of the other tokens")
    loss_agg_mode: str = setting(
        "token-mean",
        choices=("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
    entropy_coeff: float = setting(0.0, doc="entropy bonus coefficient")
    use_kl_loss: bool = setting(False, doc="add KL to the reference as a loss term")
    kl_loss_coef: float = setting(0.001, ge=0.0)
    kl_loss_type: str = setting("low_var_kl", doc="registered KL estimator")
    ulysses_sequence_parallel_size: int = setting(
        1, ge=1, doc="ranks that split each packed micro-batch's sequence (Ulysses; a backend that supports sequence "
                     "parallelism); needs model.use_remove_padding; micro-batch sizes and token budgets are per group of them")
    use_torch_compile: bool = setting(False, doc="torch.compile the actor's (and reference's) decoder layers, where "
                                                  "the training backend does")
    calculate_sum_pi_squared: bool = setting(
        False, doc="in the old log-prob pass, also the sum over the vocabulary of pi^2 at each response position "
                   "(batch column sum_pi_squared, at the sampling temperature), which adv_estimator "
                   "optimal_token_baseline needs; on a training backend that computes it")
    router_replay: str = setting(
        "off", choices=("off", "R2", "R3"),
        doc="a mixture of experts' expert choices replayed in the actor's training passes, so that the update "
            "routes each token as the policy that produced the old log-probs did: R2 the choices of the old "
            "log-prob pass, R3 the rollout engine's (rollout.return_routed_experts); on a training backend that "
            "replays routing (docs/router-replay.md)")
    freeze_vision_tower: bool = setting(
        False, doc="a vision-language model's vision tower (its image encoder) stays as loaded: only the rest "
                   "trains (verl's name; docs/multimodal.md)")
    optim: OptimConfig = setting(factory=OptimConfig)
    checkpoint: CheckpointContents = setting(factory=CheckpointContents, doc="what the actor's checkpoints hold")


@attrs.frozen
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int | None = setting(None, ge=1)
    log_prob_use_dynamic_bsz: bool | None = setting(
        None, doc="reference log-probs in token-budget micro-batches; None: actor.use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int | None = setting(
        None, ge=1, doc="token budget of a reference micro-batch; None: actor.ppo_max_token_len_per_gpu")
    ulysses_sequence_parallel_size: int | None = setting(
        None, ge=1, doc="Ulysses sequence parallelism of the reference; None: actor.ulysses_sequence_parallel_size")


@attrs.frozen
class CriticModelConfig:
    path: str | None = setting(None, doc="value model (default: model.path)")
    enable_gradient_checkpointing: bool = setting(False)
    lora_rank: int = setting(0, ge=0, doc="LoRA adapters of this rank on the critic; its value head trains whole")
    lora_alpha: float = setting(16.0, gt=0.0, doc="LoRA scale numerator: adapters add lora_alpha / lora_rank * B A")
    target_modules: tuple[str, ...] = setting(("all-linear",), doc="linear layers given adapters, by name, or "
                                                                   "all-linear")
    lora_exclude_modules: str | None = setting(
        None, doc="a regular expression: targeted linear layers whose full name matches it get no adapter")


@attrs.frozen
class CriticConfig:
    model: CriticModelConfig = setting(factory=CriticModelConfig)
    optim: OptimConfig = setting(factory=lambda: OptimConfig(lr=1e-5))
    checkpoint: CheckpointContents = setting(factory=CheckpointContents, doc="what the critic's checkpoints hold")
    ppo_mini_batch_size: int | None = setting(None, ge=1, doc="default: actor.ppo_mini_batch_size")
    ppo_micro_batch_size_per_gpu: int | None = setting(None, ge=1)
    use_dynamic_bsz: bool | None = setting(None, doc="token-budget micro-batches; None: actor.use_dynamic_bsz")
    ppo_max_token_len_per_gpu: int | None = setting(
        None, ge=1, doc="token budget of a training micro-batch; None: actor.ppo_max_token_len_per_gpu")
    forward_max_token_len_per_gpu: int | None = setting(
        None, ge=1, doc="token budget of a compute_values micro-batch; None: critic.ppo_max_token_len_per_gpu")
    ppo_epochs: int | None = setting(None, ge=1, doc="default: actor.ppo_epochs")
    cliprange_value: float = setting(0.5, ge=0.0, doc="value clip range")
    n_gpus_per_node: int = setting(0, ge=0, doc="0: colocated with the actor; > 0: its own pool of this many "
                                                "devices (CPU workers without GPUs) per node")
    loss_agg_mode: str = setting(
        "token-mean",
        choices=("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
    ulysses_sequence_parallel_size: int = setting(
        1, ge=1, doc="Ulysses sequence parallelism of the critic (a backend that supports sequence parallelism)")


@attrs.frozen
class TrainerConfig:
    project_name: str = setting("rlcore")
    experiment_name: str = setting("default")
    logger: tuple[str, ...] = setting(("console",), doc="registered loggers")
    console_metrics: tuple[str, ...] = setting(
        ("critic/score/mean", "response_length/mean", "actor/kl_loss", "actor/reward_kl_penalty", "actor/entropy",
         "timing_share/gen"), doc="metrics on the console's line per step (those a step has); all go to "
                                  "metrics.jsonl and the trackers")
    backend: str | None = setting(None, doc="training backend for actor, ref and critic (verl: model_engine); "
                                            "unset: the installed backend that declares itself the default")
    peak_tflops_per_device: float | None = setting(
        None, gt=0.0, doc="one device's peak TFLOPS in the training dtype, for perf/mfu/*; default: looked up by "
                          "the device's name (dense bf16 peak; none on a CPU, which then reports no MFU)")
    total_epochs: int = setting(30, ge=1)
    total_training_steps: int | None = setting(None, ge=1)
    critic_warmup: int = setting(0, ge=0, doc="steps that update only the critic before the actor")
    balance_batch: bool = setting(True, doc="reorder each batch so every worker gets about as many tokens")
    save_freq: int = setting(-1, ge=-1, doc="-1: never")
    test_freq: int = setting(-1, ge=-1, doc="-1: never")
    val_before_train: bool = setting(True)
    val_only: bool = setting(False, doc="validate (after any resume) and stop, without training")
    log_val_generations: int = setting(0, ge=0, doc="validation samples (input, output, score) shown to the "
                                                    "loggers at each validation")
    rollout_data_dir: str | None = setting(None, doc="write each step's generations to <dir>/<step>.jsonl")
    validation_data_dir: str | None = setting(None, doc="write each validation's generations to "
                                                        "<dir>/<step>.jsonl")
    n_gpus_per_node: int = setting(1, ge=1, doc="workers per node (CPU workers where there is no GPU)")
    nnodes: int = setting(1, ge=1)
    default_local_dir: str = setting("checkpoints/{project_name}/{experiment_name}",
                                     doc="run directory: checkpoints and metrics")
    resume_mode: str = setting("auto", doc="auto, disable, a checkpoint path, or resume_path (verl's)")
    resume_from_path: str | None = setting(None, doc="the checkpoint of resume_mode = 'resume_path'")
    max_ckpt_to_keep: int | None = setting(None, ge=1)
    max_nonfinite_steps: int = setting(
        3, ge=0, doc="steps whose actor or critic update was skipped for a non-finite loss or gradient norm "
                     "that the run tolerates; one more stops it")
    seed: int = setting(1, ge=0, lt=2**63, doc="sampling and initialisation seed (0 to 2**63 - 1)")
    ray_address: str | None = setting(None, doc="join this Ray cluster (default: RAY_ADDRESS or a local one)")
    ray: bool = setting(True, doc="run the workers as Ray actors; false: the one worker in this process (no Ray: "
                                  "breakpoints and whole tracebacks; needs nnodes = n_gpus_per_node = 1 and "
                                  "lockstep: async_training.mode off or auto)")


@attrs.frozen
class JobConfig:
    model: ModelConfig = setting(factory=ModelConfig)
    actor: ActorConfig = setting(factory=ActorConfig)
    rollout: RolloutConfig = setting(factory=RolloutConfig)
    ref: RefConfig = setting(factory=RefConfig)
    critic: CriticConfig = setting(factory=CriticConfig)
    reward: RewardConfig = setting(factory=RewardConfig)
    algorithm: AlgorithmConfig = setting(factory=AlgorithmConfig)
    distillation: DistillationConfig = setting(factory=DistillationConfig)
    data: DataConfig = setting(factory=DataConfig)
    trainer: TrainerConfig = setting(factory=TrainerConfig)
    # Plugin-owned tables keyed by dotted path ("rollout.<engine>"), each an instance of the class the
    # plugin registered with rlcore_register_config_sections.
    sections: dict[str, Any] = attrs.field(factory=dict, metadata={"internal": True})

    def section(self, path: str) -> Any:
        """A plugin-owned section; its defaults when the job file does not set it."""
        return self.sections[path]
