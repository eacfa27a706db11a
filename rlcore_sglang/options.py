"""``[rollout.sglang]``: the sglang engine's own options, passed through to ``sglang.Engine``.

The settings every engine shares (``rollout.gpu_memory_utilization`` -> ``mem_fraction_static``,
``free_cache_engine``, the sampling knobs) stay in ``[rollout]``; this table holds what only SGLang
has. An option left unset takes SGLang's own default.
"""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.api import setting


@attrs.frozen
class SglangOptions:
    max_running_requests: int | None = setting(None, ge=1, doc="most requests in one batch (SGLang's default if unset)")
    max_total_tokens: int | None = setting(None, ge=1, doc="KV-cache size in tokens")
    chunked_prefill_size: int | None = setting(None, doc="prefill chunk in tokens (-1: no chunking)")
    context_length: int | None = setting(None, ge=1,
                                         doc="context length (default: data.max_prompt_length + max_response_length)")
    disable_cuda_graph: bool = setting(False, doc="no CUDA graphs: slower steps, faster start")
    attention_backend: str | None = setting(None, doc="SGLang attention backend (its default if unset)")
    load_format: str = setting("auto", doc="how the engine reads the initial weights ('dummy': random, "
                                           "replaced by the actor's before the first generation)")
    seed: int | None = setting(None, doc="engine seed, drawn from by all its sampling (default: trainer.seed + the "
                                         "worker's rank)")
    deterministic_inference: bool = setting(False, doc="SGLang's deterministic inference: batch-invariant kernels, and "
                                                       "the only mode in which SGLang reads a seed per request (slower)")
    stop: tuple[str, ...] = setting((), doc="strings that end a response (kept in it; SGLang then loads its "
                                            "tokenizer and detokenizer)")
    stop_token_ids: tuple[int, ...] = setting((), doc="token ids that end a response, besides the eos ids")
    engine_kwargs: dict[str, Any] | None = setting(None, doc="more sglang.Engine arguments, passed as they are")
