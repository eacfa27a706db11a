"""Transformers' own routing of a Qwen3-MoE, the reference the engine's routed experts are held to."""

from __future__ import annotations

import torch


def transformers_routing(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts each position goes to in each mixture-of-experts layer, ascending (B, T, L, K), and the
    router's margin there (B, T, L): the K-th chosen expert's probability minus the best unchosen one's,
    small where the choice is a near-tie that other kernels may break the other way."""
    captured: list[torch.Tensor] = []
    gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    hooks = [gate.register_forward_hook(lambda _, __, out: captured.append(out[0])) for gate in gates]
    try:
        with torch.no_grad():
            model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    finally:
        for hook in hooks:
            hook.remove()
    rows, width = input_ids.shape
    k = model.config.num_experts_per_tok
    logits = torch.stack(captured, dim=1).float().view(rows, width, len(gates), -1)  # (B, T, L, E)
    top = torch.softmax(logits, dim=-1).topk(k + 1, dim=-1)
    return top.indices[..., :k].sort(dim=-1).values, top.values[..., k - 1] - top.values[..., k]


def vllm_layout(model, ids: list[int]) -> torch.Tensor:
    """What vLLM returns for a sequence ``ids`` (prompt + response, unpadded): the choices of every token
    but the last (seq_len - 1, num_hidden_layers, K), in the router's order, 0 in dense layers."""
    config = model.config
    captured: list[torch.Tensor] = []
    sparse = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]
    hooks = [model.model.layers[i].mlp.gate.register_forward_hook(lambda _, __, out: captured.append(out[0]))
             for i in sparse]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids[:-1]]))
    finally:
        for hook in hooks:
            hook.remove()
    out = torch.zeros(len(ids) - 1, config.num_hidden_layers, config.num_experts_per_tok, dtype=torch.uint8)
    for layer, logits in zip(sparse, captured):
        out[:, layer] = logits.float().softmax(-1).topk(config.num_experts_per_tok, dim=-1).indices.to(torch.uint8)
    return out
