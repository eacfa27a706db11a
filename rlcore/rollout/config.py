"""``[rollout]``: the settings every rollout engine shares (an engine's own options are its plugin's
``[rollout.<engine>]`` section). ``rlcore.config`` assembles it into ``JobConfig``."""

from __future__ import annotations

import attrs

from rlcore.settings import setting


@attrs.frozen
class ValidationSampling:
    n: int = setting(1, ge=1)
    do_sample: bool = setting(False, doc="false: greedy")
    temperature: float = setting(0.0, ge=0.0)
    top_p: float = setting(1.0, gt=0.0, le=1.0)
    top_k: int = setting(-1, ge=-1)


@attrs.frozen
class RolloutConfig:
    name: str | None = setting(None, doc="registered rollout engine; unset: the installed engine that declares "
                                         "itself the default")
    n: int = setting(1, ge=1, doc="responses per prompt")
    temperature: float = setting(1.0, ge=0.0)
    top_p: float = setting(1.0, gt=0.0, le=1.0)
    top_k: int = setting(-1, ge=-1, doc="-1: off")
    do_sample: bool = setting(True)
    log_prob_micro_batch_size_per_gpu: int | None = setting(None, ge=1)
    log_prob_use_dynamic_bsz: bool | None = setting(
        None, doc="old log-probs in token-budget micro-batches; None: actor.use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int | None = setting(
        None, ge=1, doc="token budget of an old log-prob micro-batch; None: actor.ppo_max_token_len_per_gpu")
    tensor_model_parallel_size: int = setting(1, ge=1)
    data_parallel_size: int = setting(
        1, ge=1, doc="ranks of one inference engine that each serve prompts of their own, tensor_model_parallel_size "
                     "devices each (attention data-parallel for mixture-of-experts models), for an engine that "
                     "supports it (docs/engines.md); the engine may ask that tensor_model_parallel_size x "
                     "data_parallel_size equal the workers")
    expert_parallel_size: int = setting(
        1, ge=1, doc="1, or tensor_model_parallel_size x data_parallel_size: a mixture-of-experts model's experts "
                     "split over the engine's ranks instead of sharded by tensor parallelism, for an engine that "
                     "supports it")
    quantization: str | None = setting(
        None, doc="the inference engine's weight quantization method, e.g. 'fp8' (the engine's own name for it): "
                  "the engine quantizes the weights it loads and each weight sync; the actor trains at "
                  "model.dtype. None: the engine runs at model.dtype")
    gpu_memory_utilization: float = setting(0.5, gt=0.0, le=1.0)
    free_cache_engine: bool = setting(True, doc="release engine memory while training")
    calculate_log_probs: bool = setting(True, doc="keep the engine's rollout_log_probs (needed by "
                                                  "algorithm.rollout_is_threshold); false: the engine is asked for "
                                                  "none (an engine that cannot skip them has them dropped)")
    return_routed_experts: bool = setting(
        False, doc="the engine returns the experts it chose for each token in each mixture-of-experts layer (batch "
                   "column routed_experts), for actor.router_replay = 'R3'; on an engine that does")
    val: ValidationSampling = setting(factory=ValidationSampling, doc="sampling for validation")
