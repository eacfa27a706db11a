"""Attention for the trained models: packed rows (many samples back to back in one row, each
attending only to itself) and padded rows whose backward stays finite.

Registered with transformers as the attention implementation ``rlcore_packed``. A forward that
passes ``cu_seq_lens_q`` (int32 (N + 1,) sample boundaries) and ``max_length_q`` gets per-sample
causal attention; any other forward (a padded batch, generation with padding and a KV cache) is
handed to transformers' own SDPA attention, with two changes that keep its gradients finite on GPUs:

- the mask (``padded_mask``) lets a query that sees no key (a left pad: causal, and every earlier
  token a pad) see every key. Such fully masked rows gave NaN gradients in SDPA's memory-efficient
  backward on an H200 (torch 2.11; docs/benchmarks.md, 2026-12-03) while the forward was finite. A
  pad's output is never read, and no real token attends to a pad, so nothing else changes;
- a masked call uses only the SDPA kernels the platform allows for it
  (``Platform.masked_attention_kernels``, set by ``use_masked_kernels``): on CUDA all but cuDNN's,
  whose backward returns NaN query gradients on H100/H200 when a masked sequence's length is 64 past
  a multiple of 128 and a row's scores are all very negative (pytorch/pytorch#196678, torch 2.11-2.13).

Two kernels do the packed case:
- ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention over the packed row, no mask, no work
  across samples) on an accelerator in bf16 / fp16, where torch has it;
- otherwise (the CPU, fp32) SDPA once per sample, causal: exact, and the right cost where kernels
  are launched cheaply.

A model that soft-caps its attention scores (Gemma 2's ``attn_logit_softcapping``: transformers
passes ``softcap``) gets the scores computed per sample by hand, capped (``tanh(s / cap) * cap``)
before the mask and the softmax, as transformers' eager attention does: neither SDPA nor torch's
varlen kernel takes a cap, and leaving it out changed Gemma 2's packed log-probs by up to 1.2 nats.
"""

from __future__ import annotations

import inspect
import logging
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import sdpa_kernel

from rlcore.api import RlcoreError

log = logging.getLogger(__name__)

NAME = "rlcore_packed"
_HALF = (torch.bfloat16, torch.float16)
_masked_kernels: list | None = None  # the SDPA kernels a masked call may use (the platform's); None: torch's pick
_varlen_broken: set[str] = set()  # device types where varlen_attn raised once: per-sample SDPA from then on


def _varlen_kernel():
    """torch's varlen FlashAttention and what its signature takes: how it is told "causal" (changed
    in torch 2.11), whether it takes grouped-query heads and a softmax scale."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, {}
    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    return varlen_attn, {"causal": causal, "gqa": "enable_gqa" in params, "scale": "scale" in params}


_VARLEN, _VARLEN_TAKES = _varlen_kernel()


def _repeat_heads(x: Tensor, groups: int, dim: int) -> Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=dim)


def _varlen(query: Tensor, key: Tensor, value: Tensor, cu_seqlens: Tensor, max_length: int,
            scaling: float | None) -> Tensor:
    """(1, H, T, D) inputs -> (T, H, D) output through FlashAttention's varlen kernel."""
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))  # (T, H, D)
    options = dict(_VARLEN_TAKES["causal"])
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and _VARLEN_TAKES["gqa"]:
        options["enable_gqa"] = True
    elif groups > 1:
        k, v = _repeat_heads(k, groups, 1), _repeat_heads(v, groups, 1)
    if _VARLEN_TAKES["scale"]:
        options["scale"] = scaling
    elif scaling is not None and abs(scaling - q.shape[-1] ** -0.5) > 1e-6:
        raise NotImplementedError("this torch's varlen_attn takes no softmax scale")
    return _VARLEN(q, k, v, cu_seqlens, cu_seqlens, max_length, max_length, **options)


def _capped_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scaling: float | None,
                      softcap: float) -> Tensor:
    """Eager attention with soft-capped scores (transformers' Gemma 2 eager attention): (1, H, L, D)."""
    scale = q.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)


def _allowed(length: int, sliding_window: int | None, device) -> Tensor:
    """(L, L) bool: which keys each query of one sample sees: causal, within the sliding window if any."""
    pos = torch.arange(length, device=device)
    allowed = pos[None, :] <= pos[:, None]
    return allowed if sliding_window is None else allowed & (pos[:, None] - pos[None, :] < sliding_window)


# eager even within compiled layers (actor.use_torch_compile): its loop over the samples, traced, recompiled for
# every new count of samples and used up dynamo's recompile limit within a few steps
@torch.compiler.disable
def _per_sample(query: Tensor, key: Tensor, value: Tensor, cu_seqlens: Tensor, scaling: float | None,
                sliding_window: int | None, softcap: float | None = None) -> Tensor:
    """(1, H, T, D) inputs -> (T, H, D) output, one causal SDPA call (with ``softcap``, one capped
    eager attention) per sample."""
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_heads(key, groups, 1), _repeat_heads(value, groups, 1)
    bounds = cu_seqlens.tolist()
    outputs = []
    for start, end in pairwise(bounds):
        q, k, v = (x[:, :, start:end] for x in (query, key, value))
        length = end - start
        if softcap is not None:
            out = _capped_attention(q, k, v, _allowed(length, sliding_window, q.device), scaling, softcap)
        elif sliding_window is not None and length > sliding_window:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=_allowed(length, sliding_window, q.device),
                                                 scale=scaling)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
        outputs.append(out)
    return torch.cat(outputs, dim=2)[0].transpose(0, 1)  # (T, H, D)


def packed_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                             attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             sliding_window: int | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention-function signature: (B, H, T, D) in, (B, T, H, D) out."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        return _padded(module, query, key, value, attention_mask, dropout, scaling, sliding_window, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"packed attention takes one packed row, got a batch of {query.shape[0]}")
    device_type = query.device.type
    softcap = kwargs.get("softcap")
    use_varlen = (_VARLEN is not None and device_type != "cpu" and query.dtype in _HALF and sliding_window is None
                  and softcap is None and device_type not in _varlen_broken)
    if use_varlen:
        try:
            return _varlen(query, key, value, cu_seqlens, int(kwargs["max_length_q"]), scaling).unsqueeze(0), None
        except (RuntimeError, NotImplementedError) as exc:  # a device torch has no varlen kernel for
            _varlen_broken.add(device_type)
            log.warning("varlen attention failed on %s (%s); packed rows use per-sample SDPA from now on",
                        device_type, exc)
    return _per_sample(query, key, value, cu_seqlens, scaling, sliding_window, softcap).unsqueeze(0), None


def _padded(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
            dropout: float, scaling: float | None, sliding_window: int | None, **kwargs) -> tuple[Tensor, None]:
    """transformers' SDPA attention over padded rows; a masked call on an accelerator uses only the
    platform's kernels for it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attend():
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)

    if attention_mask is None or _masked_kernels is None or query.device.type == "cpu":
        return attend()
    with sdpa_kernel(_masked_kernels):
        return attend()


def use_masked_kernels(kernels) -> None:
    """The SDPA kernels masked calls may use from now on in this process (a platform's
    ``masked_attention_kernels()``; None: torch's pick)."""
    global _masked_kernels
    _masked_kernels = None if kernels is None else list(kernels)


def padded_mask(*args, **kwargs) -> Tensor | None:
    """transformers' SDPA mask (``sdpa_mask``, same arguments), except that a query row that sees no
    key sees every key: (B, 1, Q, K) bool, or None where transformers leaves the mask to ``is_causal``.
    Given a padding mask it is always a mask: transformers' check whether one is needed
    (``padding_mask.all()``) makes the host wait for the device at every forward, and rows from a rollout
    are padded anyway."""
    from transformers.masking_utils import sdpa_mask

    if kwargs.get("attention_mask") is not None:
        kwargs = {**kwargs, "allow_is_causal_skip": False}
    mask = sdpa_mask(*args, **kwargs)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        return mask
    return mask | ~mask.any(dim=-1, keepdim=True)


def packed_kernel(device_type: str) -> str:
    """Which kernel packed rows in bf16 use on ``device_type``: "varlen" or "per-sample sdpa"."""
    usable = _VARLEN is not None and device_type != "cpu" and device_type not in _varlen_broken
    return "varlen" if usable else "per-sample sdpa"


def register(name: str = NAME, forward=packed_attention_forward) -> None:
    """Make ``name`` known to transformers as the attention ``forward`` (idempotent), with SDPA's masks
    less their fully masked rows (``padded_mask``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, padded_mask)


def use_packed_attention(model: nn.Module, name: str = NAME) -> None:
    """Switch a transformers model (and its sub-models) to ``rlcore_packed`` (or another registered
    implementation built on it, ``name``)."""
    if name == NAME:
        register()
    model.set_attn_implementation(name)
    if model.config._attn_implementation != name:
        raise RlcoreError(f"{type(model).__name__} does not take a custom attention implementation "
                           "(transformers' AttentionInterface); model.use_remove_padding needs one")
