"""The ``sglang`` rollout engine: SGLang's offline ``sglang.Engine`` beside the actor in the hybrid worker.

Built against SGLang 0.5's documented offline API and NOT yet run against a real SGLang (it cannot
run on the machines rlcore is developed on): ``Engine(**server_args)``,
``generate(input_ids=..., sampling_params=..., return_logprob=True)``,
``update_weights_from_tensor(named_tensors=..., flush_cache=...)``, ``flush_cache()``,
``release_memory_occupation(tags=...)`` / ``resume_memory_occupation(tags=...)``.

The engine's scheduler runs in SGLang's own subprocess; new weights go to it bucket by bucket through
``update_weights_from_tensor`` (on a GPU SGLang passes them as CUDA IPC handles, no copy). With
``rollout.free_cache_engine`` the engine gives back its weights and KV cache while the actor trains
(SGLang's memory saver); released weights are refilled from the actor before the next generation,
so generation never runs on discarded memory. One engine per worker: tensor parallelism across
workers is not supported yet.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

from rlcore.batch import Batch
from rlcore.config.schema import JobConfig
from rlcore.errors import RlcoreError
from rlcore.models import load_tokenizer, resolve_dtype, resolve_model_path
from rlcore.platforms import Platform
from rlcore.roles import Actor, Rollout, SamplingParams, group_seed
from rlcore.rollout.outputs import eos_token_ids, group_leader, prompt_tensors, response_rows, unpadded
from rlcore_sglang.options import SglangOptions

INSTALL = "pip install rlcore[sglang]"
SYNC_BUCKET_BYTES = 512 * 2**20
MEMORY_TAGS = ["weights", "kv_cache"]


def import_sglang():
    """The sglang module, or one error that says how to install it."""
    try:
        import sglang
    except ImportError as exc:
        raise RlcoreError(f"rollout.name = 'sglang' needs the sglang library, which does not import here "
                          f"({exc}); install it with: {INSTALL}") from None
    return sglang


class SglangRollout(Rollout):
    def __init__(self, config: JobConfig, platform: Platform, actor: Actor | None, engine_factory=None):
        """``engine_factory(**arguments)`` builds the engine (default ``sglang.Engine``; tests pass a fake)."""
        if engine_factory is None:
            engine_factory = import_sglang().Engine
        if config.rollout.tensor_model_parallel_size != 1:
            raise RlcoreError(f"rollout.tensor_model_parallel_size = {config.rollout.tensor_model_parallel_size}: "
                              "the sglang engine runs one engine per worker; use 1 (or the vllm engine)")
        self.config, self.actor = config, actor
        self.options: SglangOptions = config.section("rollout.sglang")
        model = config.model
        model_path = resolve_model_path(model.path)
        tokenizer_path = resolve_model_path(model.tokenizer_path or model.path)
        tokenizer = load_tokenizer(tokenizer_path, trust_remote_code=model.trust_remote_code)
        self.pad_id = tokenizer.pad_token_id
        self.stop_token_ids = sorted({*eos_token_ids(model_path, tokenizer), *self.options.stop_token_ids})
        for key, value in platform.engine_env("sglang").items():
            os.environ.setdefault(key, value)
        self.releases = config.rollout.free_cache_engine
        self.engine = engine_factory(**engine_arguments(config, platform, model_path, tokenizer_path))
        self.weights_current = actor is None  # else the engine holds model.path's weights, not the actor's
        self.weights_released = self.kv_released = False

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        if not self.weights_current:
            self._sync_from_actor()
        prompt_ids, prompt_mask = prompt_tensors(prompts, self.pad_id, "sglang")
        prompt_ids = prompt_ids.repeat_interleave(sampling.n, dim=0)  # (B*n, P): each prompt's n rows in a row
        prompt_mask = prompt_mask.repeat_interleave(sampling.n, dim=0)
        rows = unpadded(prompt_ids, prompt_mask)
        outputs = self.engine.generate(input_ids=rows, sampling_params=self.sampling_params(sampling, len(rows)),
                                       return_logprob=True)
        responses, log_probs = completions(outputs, len(rows))
        return response_rows(prompt_ids, prompt_mask, responses, log_probs, sampling.max_new_tokens, self.pad_id)

    def sampling_params(self, sampling: SamplingParams, rows: int) -> dict | list[dict]:
        """One dict for every row, or one per row when seeded (row i takes base + i, the base mixing
        the call's seed with this worker's rank: each worker runs its own engine)."""
        params = sampling_arguments(sampling, self.options, self.stop_token_ids)
        if sampling.seed is None:
            return params
        base = group_seed(sampling.seed, group_leader(None))
        return [params | {"sampling_seed": base + row} for row in range(rows)]

    # -- weights and memory ----------------------------------------------------------------------
    def update_weights(self, buckets: Iterator[list[tuple[str, torch.Tensor]]]) -> None:
        if self.weights_released:  # resumed memory holds no values: every weight comes next
            self.engine.resume_memory_occupation(tags=["weights"])
            self.weights_released = False
        for bucket in buckets:
            self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False)
        self.engine.flush_cache()  # cached prefixes were computed with the old weights
        self.weights_current = True

    def release_memory(self) -> None:
        if self.releases and not self.kv_released:
            self.engine.release_memory_occupation(tags=MEMORY_TAGS)
            self.weights_released = self.kv_released = True
            self.weights_current = False

    def resume_memory(self) -> None:
        if self.weights_released:
            self._sync_from_actor()  # no update came since the release: take the actor's weights again
        if self.kv_released:
            self.engine.resume_memory_occupation(tags=["kv_cache"])
            self.kv_released = False

    def _sync_from_actor(self) -> None:
        if self.actor is None:
            raise RlcoreError("the sglang engine released its weights and has no actor to take them from again")
        self.update_weights(self.actor.weights_for_rollout(SYNC_BUCKET_BYTES))


def engine_arguments(config: JobConfig, platform: Platform, model_path: str, tokenizer_path: str) -> dict:
    """The ``sglang.Engine`` keyword arguments (SGLang's ``ServerArgs``) for this job."""
    options: SglangOptions = config.section("rollout.sglang")
    rank = dist.get_rank() if dist.is_initialized() else 0
    arguments = {
        "model_path": model_path,
        "tokenizer_path": tokenizer_path,
        "trust_remote_code": config.model.trust_remote_code,
        "dtype": str(resolve_dtype(config.model.dtype, platform)).removeprefix("torch."),
        "tp_size": 1,
        "mem_fraction_static": config.rollout.gpu_memory_utilization,
        "context_length": options.context_length or config.data.max_prompt_length + config.data.max_response_length,
        "disable_cuda_graph": options.disable_cuda_graph,
        "load_format": options.load_format,
        "random_seed": options.seed if options.seed is not None else config.trainer.seed + rank,
        "enable_memory_saver": config.rollout.free_cache_engine,
    }
    for name in ("max_running_requests", "max_total_tokens", "chunked_prefill_size", "attention_backend"):
        if getattr(options, name) is not None:
            arguments[name] = getattr(options, name)
    return arguments | (options.engine_kwargs or {})


def sampling_arguments(sampling: SamplingParams, options: SglangOptions, stop_token_ids: list[int]) -> dict:
    """SGLang sampling parameters: every knob set, so that defaults cannot change sampling."""
    greedy = not sampling.do_sample or sampling.temperature == 0
    return {
        "n": 1,  # the n samples of a prompt are n rows (explicit order, a seed per row)
        "max_new_tokens": sampling.max_new_tokens,
        "temperature": 0.0 if greedy else sampling.temperature,  # SGLang: 0 is greedy
        "top_p": 1.0 if greedy else sampling.top_p,
        "top_k": -1 if greedy or sampling.top_k <= 0 else sampling.top_k,  # -1: off
        "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "stop": list(options.stop) or None,
        "stop_token_ids": list(stop_token_ids),
        "no_stop_trim": True,  # keep the stop string or token in the response, as the vllm engine does
        "ignore_eos": False,
    }


def completions(outputs: list[dict] | dict, rows: int) -> tuple[list[list[int]], list[list[float]]]:
    """Token ids and their log-probs from SGLang's outputs, one per row in order.

    Each output's ``meta_info["output_token_logprobs"]`` lists ``(logprob, token_id, text)`` per
    generated token (``return_logprob=True``)."""
    outputs = [outputs] if isinstance(outputs, dict) else list(outputs)
    if len(outputs) != rows:
        raise RuntimeError(f"SGLang returned {len(outputs)} outputs for {rows} prompt rows")
    responses, log_probs = [], []
    for output in outputs:
        generated = output["meta_info"]["output_token_logprobs"]
        responses.append([int(entry[1]) for entry in generated])
        log_probs.append([float(entry[0]) for entry in generated])
    return responses, log_probs
