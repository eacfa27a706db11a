"""The ``sglang`` rollout engine: SGLang's offline ``sglang.Engine`` beside the actor in the hybrid worker.

Supported SGLang: 0.5.12 and later in 0.5 (``MIN_VERSION``; the ``sglang`` extra says
``sglang>=0.5.12,<0.6``). 0.5.12-0.5.17 are the releases that pin torch 2.11. The calls made here were
checked against the sources of SGLang 0.5.12 and 0.5.17 (``sglang/srt/entrypoints/engine.py``,
``server_args.py``, ``sampling/sampling_params.py``, ``managers/tokenizer_manager.py``, the scheduler's
weight-update and memory paths); where the two releases differ it is said at the call. **This engine
has not yet run against a real SGLang**: SGLang's kernels need a CUDA GPU, and the GPU tests
(``tests/sglang/test_on_gpu.py``) have not been run yet.

The engine's scheduler runs in SGLang's own subprocess, on the device the worker uses (``base_gpu_id``).
New weights go to it bucket by bucket through ``update_weights_from_tensor``: SGLang pickles the
tensors with torch's multiprocessing reductions, so the actor's CUDA tensors travel as CUDA IPC
handles, without a copy. With ``rollout.free_cache_engine`` the engine gives back its weights and KV
cache while the actor trains (SGLang's memory saver, ``release_memory_occupation``); released weights
hold no values once resumed, so they are refilled from the actor before the next generation.

Sampling: SGLang's scheduler draws from one generator, seeded once when the engine starts
(``random_seed``); SGLang has no call to seed it again, so a call's ``seed`` cannot be applied the way
the vllm engine applies it. Per-request seeds (``sampling_seed``) are read by SGLang only when the
engine runs with ``enable_deterministic_inference`` (``[rollout.sglang] deterministic_inference``);
then every row gets its own seed (SGLang's seeded sampler is batched: no per-request path).

One engine per worker: tensor parallelism is not supported (SGLang starts one scheduler process per
tensor-parallel rank from the one process that builds the ``Engine``, and needs all their devices
visible to it; a Ray worker sees only its own device).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

from rlcore.api import (
    ROLLOUT_TIMING,
    Actor,
    Batch,
    Platform,
    RlcoreError,
    Rollout,
    RolloutSpec,
    SamplingParams,
    Timer,
    eos_token_ids,
    group_leader,
    group_seed,
    load_tokenizer,
    local_device,
    prompt_tensors,
    resolve_dtype,
    resolve_model_path,
    response_rows,
    unpadded,
)
from rlcore_sglang.options import SglangOptions

INSTALL = "pip install rlcore[sglang]"
MIN_VERSION = (0, 5, 12)
SYNC_BUCKET_BYTES = 512 * 2**20
# SGLang's memory-saver tags (sglang/srt/constants.py, the same in 0.5.12 and 0.5.17). "cuda_graph" (a
# third tag) is kept: verl releases these two as well, and a release of the graphs' memory is untried.
WEIGHTS, KV_CACHE = "weights", "kv_cache"
MEMORY_TAGS = [KV_CACHE, WEIGHTS]


def import_sglang():
    """The sglang module, or one error that says how to install it."""
    try:
        import sglang
    except ImportError as exc:
        raise RlcoreError(f"rollout.name = 'sglang' needs the sglang library, which does not import here "
                          f"({exc}); install it with: {INSTALL} (SGLang needs a CUDA GPU; docs/engines.md "
                          f"lists the versions)") from None
    check_version(getattr(sglang, "__version__", "0"))
    return sglang


def check_version(version: str) -> None:
    """Refuse an SGLang older than ``MIN_VERSION`` at start, naming the version found."""
    release = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())  # "17rc1" -> 17
        release.append(int(digits) if digits else 0)
    if tuple(release) < MIN_VERSION:
        raise RlcoreError(f"rollout.name = 'sglang' needs sglang {'.'.join(map(str, MIN_VERSION))} or newer; this "
                          f"environment has sglang {version}. Upgrade it: {INSTALL}")


class SglangRollout(Rollout):
    def __init__(self, spec: RolloutSpec, platform: Platform, actor: Actor | None, engine_factory=None):
        """``engine_factory(**arguments)`` builds the engine (default ``sglang.Engine``; tests pass a fake)."""
        for name in ("tensor_model_parallel_size", "data_parallel_size", "expert_parallel_size"):
            if getattr(spec.rollout, name) != 1:
                raise RlcoreError(f"rollout.{name} = {getattr(spec.rollout, name)}: the sglang engine runs one "
                                  "engine per worker on its one device (SGLang wants every device of a "
                                  "tensor-, data- or expert-parallel engine in the one process that starts it); "
                                  "use 1, or the vllm engine")
        if engine_factory is None:
            engine_factory = import_sglang().Engine
        self.spec, self.actor = spec, actor
        self.options: SglangOptions = spec.section("rollout.sglang")
        model = spec.model
        model_path = resolve_model_path(model.path)
        tokenizer_path = resolve_model_path(model.tokenizer_path or model.path)
        tokenizer = load_tokenizer(tokenizer_path, trust_remote_code=model.trust_remote_code)
        self.pad_id = tokenizer.pad_token_id
        self.stop_token_ids = sorted({*eos_token_ids(model_path, tokenizer), *self.options.stop_token_ids})
        for key, value in platform.engine_env("sglang").items():
            os.environ.setdefault(key, value)
        self.releases = spec.rollout.free_cache_engine
        self.arguments = engine_arguments(spec, platform, model_path, tokenizer_path)
        self.engine = engine_factory(**self.arguments)
        # per-request seeds are read only by SGLang's deterministic sampler (sampling_batch_info.py)
        self.seeds_rows = bool(self.arguments.get("enable_deterministic_inference"))
        self.weights_current = actor is None  # else the engine holds model.path's weights, not the actor's
        self.weights_released = self.kv_released = False

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        clock = Timer()
        if not self.weights_current:
            with clock("prepare"):
                self._sync_from_actor()
        prompt_ids, prompt_mask = prompt_tensors(prompts, self.pad_id, "sglang")
        prompt_ids = prompt_ids.repeat_interleave(sampling.n, dim=0)  # (B*n, P): each prompt's n rows in a row
        prompt_mask = prompt_mask.repeat_interleave(sampling.n, dim=0)
        rows = unpadded(prompt_ids, prompt_mask)
        with_log_probs = self.spec.rollout.calculate_log_probs  # false: SGLang computes none
        with clock("engine"):
            outputs = self.engine.generate(input_ids=rows, sampling_params=self.sampling_params(sampling, len(rows)),
                                           return_logprob=with_log_probs)
        with clock("rows"):
            responses, log_probs = completions(outputs, len(rows), with_log_probs)
            out = response_rows(prompt_ids, prompt_mask, responses, log_probs, sampling.max_new_tokens, self.pad_id)
        return Batch(out.tensors, out.rows, out.meta | {ROLLOUT_TIMING: clock.seconds})

    def sampling_params(self, sampling: SamplingParams, rows: int) -> dict | list[dict]:
        """One dict for every row (SGLang applies a dict to the whole batch); one per row only when
        the call is seeded and the engine reads seeds (deterministic inference): row i takes base + i,
        the base mixing the call's seed with this worker's rank, as each worker runs its own engine."""
        params = sampling_arguments(sampling, self.options, self.stop_token_ids)
        if sampling.seed is None or not self.seeds_rows:
            return params
        base = group_seed(sampling.seed, group_leader(None))
        return [params | {"sampling_seed": base + row} for row in range(rows)]

    # -- weights and memory ----------------------------------------------------------------------
    def update_weights(self, buckets: Iterator[list[tuple[str, torch.Tensor]]]) -> None:
        if self.weights_released:  # resumed memory holds no values: every weight comes next
            self.engine.resume_memory_occupation(tags=[WEIGHTS])
            self.weights_released = False
        for bucket in buckets:
            # load_format None: the model's own load_weights (fuses q/k/v, gate/up). SGLang answers
            # (success, message) and only logs a failure (0.5.12 and 0.5.17 alike): check it here.
            answer = self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False)
            check_answer("update_weights_from_tensor", answer)
        self.engine.flush_cache()  # cached prefixes were computed with the old weights
        self.weights_current = True

    def release_memory(self) -> None:
        if self.releases and not self.kv_released:
            self.engine.release_memory_occupation(tags=MEMORY_TAGS)
            self.weights_released = self.kv_released = True
            self.weights_current = False

    def resume_memory(self) -> None:
        # SGLang's scheduler removes each resumed tag from its set of released ones (a KeyError for a
        # tag not released), so only released tags are resumed, each once.
        if self.weights_released:
            self._sync_from_actor()  # no update came since the release: take the actor's weights again
        if self.kv_released:
            self.engine.resume_memory_occupation(tags=[KV_CACHE])
            self.kv_released = False

    def _sync_from_actor(self) -> None:
        if self.actor is None:
            raise RlcoreError("the sglang engine released its weights and has no actor to take them from again")
        self.update_weights(self.actor.weights_for_rollout(SYNC_BUCKET_BYTES))


def check_answer(call: str, answer) -> None:
    """Raise SGLang's message where an engine call answered ``(False, message)``."""
    if isinstance(answer, tuple) and len(answer) == 2 and answer[0] is False:
        raise RuntimeError(f"SGLang's {call} failed: {answer[1]}")


def engine_arguments(spec: RolloutSpec, platform: Platform, model_path: str, tokenizer_path: str) -> dict:
    """The ``sglang.Engine`` keyword arguments (SGLang's ``ServerArgs`` fields) for this job; each is a
    ``ServerArgs`` field in both 0.5.12 and 0.5.17."""
    options: SglangOptions = spec.section("rollout.sglang")
    rank = dist.get_rank() if dist.is_initialized() else 0
    arguments = {
        "model_path": model_path,
        "tokenizer_path": tokenizer_path,
        "trust_remote_code": spec.model.trust_remote_code,
        "dtype": str(resolve_dtype(spec.model.dtype, platform)).removeprefix("torch."),
        "tp_size": 1,
        "dp_size": spec.rollout.data_parallel_size,
        "ep_size": spec.rollout.expert_parallel_size,
        "quantization": spec.rollout.quantization,
        # SGLang's scheduler takes device base_gpu_id of those visible: the device this worker uses
        # (0 in a Ray worker, which sees only its own; the local rank's where a worker sees them all)
        "base_gpu_id": local_device(platform).index or 0,
        "mem_fraction_static": spec.rollout.gpu_memory_utilization,
        "context_length": options.context_length or spec.context_length,
        # 0.5.17 keeps disable_cuda_graph as a Python-only argument (no command-line flag) that turns
        # off both its prefill and decode graphs; 0.5.12 has it as a plain flag. Same meaning.
        "disable_cuda_graph": options.disable_cuda_graph,
        "load_format": options.load_format,
        "random_seed": options.seed if options.seed is not None else spec.seed + rank,
        "enable_memory_saver": spec.rollout.free_cache_engine,
        # Without stop strings nothing needs text: prompts go in as token ids, stop tokens are passed
        # as ids, so SGLang can skip its tokenizer and detokenizer process.
        "skip_tokenizer_init": not options.stop,
    }
    if spec.model.override_config:  # the engine's model must be the actor's
        arguments["json_model_override_args"] = json.dumps(spec.model.override_config)
    if options.deterministic_inference:
        arguments["enable_deterministic_inference"] = True
    for name in ("max_running_requests", "max_total_tokens", "chunked_prefill_size", "attention_backend"):
        if getattr(options, name) is not None:
            arguments[name] = getattr(options, name)
    return arguments | (options.engine_kwargs or {})


def sampling_arguments(sampling: SamplingParams, options: SglangOptions, stop_token_ids: list[int]) -> dict:
    """SGLang sampling parameters (``sampling_params.py``; the same names in 0.5.12 and 0.5.17): every
    knob set, so that defaults cannot change sampling."""
    greedy = not sampling.do_sample or sampling.temperature == 0
    return {
        "n": 1,  # the n samples of a prompt are n rows (explicit order; SGLang's n reorders them)
        "max_new_tokens": sampling.max_new_tokens,
        # SGLang turns temperature 0 into top_k 1 at temperature 1: greedy, with log-probs at temperature 1
        "temperature": 0.0 if greedy else sampling.temperature,
        "top_p": 1.0 if greedy else sampling.top_p,
        "top_k": -1 if greedy or sampling.top_k <= 0 else sampling.top_k,  # -1: the whole vocabulary
        "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "stop": list(options.stop) or None,
        "stop_token_ids": list(stop_token_ids),
        "no_stop_trim": True,  # keep the stop string in the text, as the vllm engine does (ids are never trimmed)
        "ignore_eos": False,
    }


def completions(outputs: list[dict] | dict, rows: int,
                with_log_probs: bool = True) -> tuple[list[list[int]], list[list[float]] | None]:
    """Token ids and their log-probs from SGLang's outputs, one per row in order (``with_log_probs``
    false: the ids from ``output_ids`` and no log-probs, SGLang having been asked for none).

    Each output (tokenizer_manager.py) holds ``output_ids`` (every generated token, a stop token
    included) and ``meta_info["output_token_logprobs"]``: one ``(logprob, token_id, text)`` per
    generated token with ``return_logprob=True`` (text None without ``return_text_in_logprobs``).
    The log-probs are SGLang's after temperature, before top-k/top-p (``layers/sampler.py``).
    """
    outputs = [outputs] if isinstance(outputs, dict) else list(outputs)
    if len(outputs) != rows:
        raise RuntimeError(f"SGLang returned {len(outputs)} outputs for {rows} prompt rows")
    if not with_log_probs:
        return [[int(token) for token in output["output_ids"]] for output in outputs], None
    responses, log_probs = [], []
    for row, output in enumerate(outputs):
        generated = output["meta_info"]["output_token_logprobs"]
        ids = [int(entry[1]) for entry in generated]
        if "output_ids" in output and list(output["output_ids"]) != ids:
            raise RuntimeError(f"SGLang's output {row}: {len(output['output_ids'])} output_ids but log-probs for "
                               f"{len(ids)} tokens, or other tokens")
        responses.append(ids)
        log_probs.append([float(entry[0]) for entry in generated])
    return responses, log_probs
