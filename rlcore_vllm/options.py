"""``[rollout.vllm]``: the vllm engine's own options, passed through to ``vllm.LLM``.

The settings every engine shares (``rollout.tensor_model_parallel_size``, ``gpu_memory_utilization``,
``free_cache_engine``, the sampling knobs) stay in ``[rollout]``; this table holds what only vLLM
has. An option left unset takes vLLM's own default. ``problems`` is the table's job check.
"""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.api import setting

LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_PROB_SOURCES = ("auto", "engine", "sampler")


@attrs.frozen
class VllmOptions:
    max_num_seqs: int | None = setting(None, ge=1, doc="most sequences in one engine step (vLLM's default if unset)")
    max_num_batched_tokens: int | None = setting(None, ge=1, doc="most tokens in one engine step")
    max_model_len: int | None = setting(None, ge=1,
                                        doc="context length (default: data.max_prompt_length + max_response_length)")
    enforce_eager: bool = setting(False, doc="no CUDA graphs / compilation: slower steps, faster start")
    enable_prefix_caching: bool = setting(True, doc="share the KV cache of a prompt's n samples")
    enable_chunked_prefill: bool | None = setting(None, doc="split long prefills into chunks batched with decodes "
                                                            "(vLLM's default if unset)")
    load_format: str = setting("auto", doc="how the engine reads the initial weights ('dummy': random, "
                                           "replaced by the actor's before the first generation)")
    logprobs_mode: str = setting("processed_logprobs", choices=LOGPROBS_MODES,
                                 doc="rollout_log_probs after temperature/top-k/top-p (processed) or before (raw)")
    log_prob_source: str = setting("auto", choices=LOG_PROB_SOURCES,
                                   doc="where rollout_log_probs come from: 'engine' (vLLM's logprobs output), "
                                       "'sampler' (taken at vLLM's sampler in the worker, sparing its per-token host "
                                       "work; calls with top-k or top-p on get the engine's) or 'auto' (the sampler "
                                       "where the job and vLLM's model runner allow it, else the engine; the start "
                                       "says which)")
    seed: int | None = setting(None, doc="engine seed (default: trainer.seed + the data-parallel rank)")
    stop: tuple[str, ...] = setting((), doc="strings that end a response (kept in it)")
    stop_token_ids: tuple[int, ...] = setting((), doc="token ids that end a response, besides the eos ids")
    engine_kwargs: dict[str, Any] | None = setting(None, doc="more vllm.LLM arguments, passed as they are")
    lora_sync: str = setting("merged", choices=("merged", "adapter"),
                             doc="a LoRA actor's weights to the engine: 'merged' (W + scale B A, every weight, every "
                                 "step) or 'adapter' (vLLM applies the adapter itself, only the adapter moves, in "
                                 "lockstep and in the asynchronous forms; not with async_training.partial_rollout)")
    log_level: str | None = setting(None, choices=(None, *LOG_LEVELS),
                                    doc="vLLM's own log level, FlashInfer's with it; unset: $VLLM_LOGGING_LEVEL where it is set, else "
                                        "'warning' (the console shows rlcore's step lines and vLLM's warnings and "
                                        "errors; 'info' brings back its lines at every weight sync and reset, and its progress "
                                        "bars of loading the weights and capturing CUDA graphs, and FlashInfer's kernel-tuning lines at start)")


def problems(job) -> list[str]:
    """Errors of a job whose vllm engine applies the actor's LoRA adapter itself (``lora_sync = 'adapter'``
    with a LoRA actor); registered by ``rlcore_vllm``."""
    config = job.config
    if config.rollout.name != "vllm" or "rollout.vllm" not in config.sections:
        return []
    options: VllmOptions = config.section("rollout.vllm")
    if options.lora_sync != "adapter" or not (config.model.lora_rank or config.model.lora_adapter_path):
        return []
    errors = []
    if "async_training" in config.sections and config.section("async_training").partial_rollout:
        errors.append("rollout.vllm.lora_sync = 'adapter' with async_training.partial_rollout = true: a generation "
                      "in flight keeps the LoRA adapter it started with (a vLLM request's adapter is fixed when it "
                      "is added); set async_training.partial_rollout = false, or rollout.vllm.lora_sync = 'merged'")
    if options.load_format == "dummy":
        errors.append("rollout.vllm.lora_sync = 'adapter' with rollout.vllm.load_format = 'dummy': the engine's base "
                      "weights are read from model.path at its start and never synced (only the adapter moves), so "
                      "they would stay random; set load_format = 'auto', or lora_sync = 'merged'")
    return errors
