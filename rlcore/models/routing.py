"""Recording and replaying a Hugging Face mixture of experts' routing (``actor.router_replay``).

A transformers 5.x MoE layer asks its router, ``forward(hidden (N, H)) -> (logits (N, E), scores (N, K),
indices (N, K))``, which K of E experts each of the forward's N tokens goes to and with what weight.
``ModelRouting`` puts a forward hook on every router of a model, in module order (the model's MoE layers,
L of them), and either records the indices each router chose or replaces them with given ones. A replayed
token's scores are the router's own softmax probabilities at the given experts (renormalised over them
where the router renormalises its top k), so the gradient still reaches the router's weights.

Routing travels between passes as the batch column ``routed_experts`` (B, T, L, K), aligned with
``input_ids``, entries < 0 where nothing was recorded (that token is then routed by the router itself).
A forward sees its tokens in one of two orders: padded rows (B * T tokens, row after row) or packed rows
(the real tokens only, ``model.use_remove_padding``); ``tokens_of`` and ``column_of`` convert.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from rlcore.errors import RlcoreError

# routers whose forward is (hidden) -> (logits, top-k scores, top-k indices) with scores = softmax(logits)
# at the indices: those that renormalise the top k when ``norm_topk_prob``, and those that always do
ROUTERS_WITH_NORM_SETTING = frozenset({"Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "Qwen3NextTopKRouter",
                                       "OlmoeTopKRouter", "FlexOlmoTopKRouter"})
ROUTERS_ALWAYS_RENORMALISED = frozenset({"MixtralTopKRouter", "Qwen3_5MoeTopKRouter", "Qwen3VLMoeTextTopKRouter"})
SUPPORTED_ROUTERS = ROUTERS_WITH_NORM_SETTING | ROUTERS_ALWAYS_RENORMALISED
NOT_RECORDED = -1


def _looks_like_router(module: nn.Module) -> bool:
    return type(module).__name__.lower().endswith("router")


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The model's routers in module order (one per MoE layer); an error naming the model's class when it
    has none, or has a router of a kind whose replay is not known here."""
    routers, unknown = [], set()
    for module in model.modules():
        kind = type(module).__name__
        if kind in SUPPORTED_ROUTERS:
            routers.append(module)
        elif _looks_like_router(module):
            unknown.add(kind)
    model_class = type(model).__name__
    if unknown:
        raise RlcoreError(f"router replay: {model_class} routes with {', '.join(sorted(unknown))}, whose routing "
                          f"rlcore cannot record or replay; supported routers: {', '.join(sorted(SUPPORTED_ROUTERS))} "
                          "(Qwen2-MoE, Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE, Qwen3-VL-MoE, Mixtral, OLMoE, FlexOlmo)")
    if not routers:
        raise RlcoreError(f"router replay: {model_class} has no mixture-of-experts router (set "
                          "actor.router_replay = 'off' for a dense model)")
    return routers


def _renormalises(router: nn.Module) -> bool:
    return type(router).__name__ in ROUTERS_ALWAYS_RENORMALISED or bool(router.norm_topk_prob)


def replayed_scores(router: nn.Module, logits: Tensor, indices: Tensor, dtype: torch.dtype) -> Tensor:
    """The weights (N, K) the router gives ``indices`` (N, K): its softmax probabilities there, renormalised
    over the K where it renormalises its own top k; with the gradient to ``logits``."""
    scores = torch.softmax(logits.float(), dim=-1).gather(-1, indices)
    if _renormalises(router):
        scores = scores / scores.sum(-1, keepdim=True)
    return scores.to(dtype)


class ModelRouting:
    """Forward hooks on a model's routers (``moe_routers``) that pass routing through unchanged, except
    inside ``recording()`` (each router's chosen indices kept, call by call) or ``replaying(tokens)``
    (each router made to choose ``tokens[:, layer]``). Replay stays in force for the whole ``with`` block,
    so a backward pass that recomputes the forward (gradient checkpointing) inside it routes the same way."""

    def __init__(self, model: nn.Module):
        self.routers = moe_routers(model)
        self.top_k = int(self.routers[0].top_k)
        self._records: list[list[Tensor]] | None = None
        self._replay: Tensor | None = None
        self._handles = [router.register_forward_hook(self._hook(layer)) for layer, router in enumerate(self.routers)]

    def remove(self) -> None:
        """Takes the hooks off the routers (a borrowed model goes back as it came)."""
        for handle in self._handles:
            handle.remove()

    @property
    def num_layers(self) -> int:
        return len(self.routers)

    def _hook(self, layer: int):
        def hook(router: nn.Module, args, output):
            if self._replay is not None:
                output = self._replayed(router, layer, output)
            if self._records is not None:
                self._records[layer].append(output[2].detach().to(torch.int16))
            return output
        return hook

    def _replayed(self, router: nn.Module, layer: int, output: tuple[Tensor, Tensor, Tensor]
                  ) -> tuple[Tensor, Tensor, Tensor]:
        logits, own_scores, own_indices = output
        given = self._replay[:, layer].to(own_indices.device)  # (N, K)
        if given.shape != own_indices.shape:
            raise RlcoreError(f"router replay: MoE layer {layer} ({type(router).__name__}) routes "
                              f"{own_indices.shape[0]} tokens x {own_indices.shape[1]} experts, but the "
                              f"routed_experts column gives {tuple(given.shape)}")
        recorded = (given >= 0).all(-1, keepdim=True)  # (N, 1) tokens with a choice to replay
        indices = torch.where(recorded, given.long(), own_indices)
        return logits, replayed_scores(router, logits, indices, own_scores.dtype), indices.to(own_indices.dtype)

    @contextmanager
    def recording(self) -> Iterator[list[list[Tensor]]]:
        """Yields, per MoE layer, the list of (N, K) int16 indices it routed to (replayed ones inside
        ``replaying``), one per forward call."""
        self._records = [[] for _ in self.routers]
        try:
            yield self._records
        finally:
            self._records = None

    @contextmanager
    def replaying(self, tokens: Tensor) -> Iterator[None]:
        """Routes the forwards inside as ``tokens`` (N, L, K) says (entries < 0: the router's choice)."""
        if tokens.dim() != 3 or tokens.shape[1:] != (self.num_layers, self.top_k):
            raise RlcoreError(f"router replay: the routed_experts column has {tokens.shape[-2]} MoE layers x "
                              f"{tokens.shape[-1]} experts per token; the model has {self.num_layers} x {self.top_k}")
        self._replay = tokens
        try:
            yield
        finally:
            self._replay = None


def recorded_tokens(records: list[list[Tensor]]) -> Tensor:
    """The (N, L, K) indices of one recorded forward (``ModelRouting.recording``'s one call per layer)."""
    return torch.stack([torch.cat(calls) for calls in records], dim=1)


def generated_column(records: list[list[Tensor]], rows: int, width: int) -> Tensor:
    """(rows, width, L, K) int16 routing of a generation recorded with a KV cache: per layer, the prompt's
    forward (rows x P tokens) then one forward per new token (rows x 1); the token a step samples is
    forwarded by the next step, so the last sampled token has none (-1), nor the positions past the last step."""
    layers = []
    for calls in records:
        steps = [call.view(rows, -1, call.shape[-1]) for call in calls]  # (rows, P, K), then (rows, 1, K) each
        layers.append(torch.cat(steps, dim=1))
    recorded = torch.stack(layers, dim=2)  # (rows, P + steps - 1, L, K)
    column = torch.full((rows, width, *recorded.shape[2:]), NOT_RECORDED, dtype=torch.int16)
    column[:, :recorded.shape[1]] = recorded.cpu()[:, :width]
    return column


def tokens_of(column: Tensor, attention_mask: Tensor, packed: bool) -> Tensor:
    """(B, T, L, K) ``routed_experts`` -> (N, L, K) int64 in a forward's token order: every position row after
    row (padded rows), or only the real tokens (``attention_mask``), as ``packed`` rows hold them."""
    tokens = column[attention_mask.bool()] if packed else column.flatten(0, 1)
    return tokens.long()


def column_of(tokens: Tensor, attention_mask: Tensor, packed: bool) -> Tensor:
    """(N, L, K) indices in a forward's token order -> the (B, T, L, K) int16 column, < 0 at pads."""
    mask = attention_mask.bool()
    rows, width = mask.shape
    column = torch.full((rows, width, *tokens.shape[1:]), NOT_RECORDED, dtype=torch.int16, device=tokens.device)
    if packed:
        column[mask] = tokens.to(torch.int16)
    else:
        column = tokens.to(torch.int16).view(rows, width, *tokens.shape[1:]).clone()
        column[~mask] = NOT_RECORDED
    return column


# --- the job's checks of actor.router_replay (registered by rlcore.builtins) ------------------------


def router_replay_problems(job) -> list[str]:
    """R2 records the routing in the old log-prob pass (which bypass mode skips); R3 replays the
    engine's choices, so the engine must return them. (A backend that replays routing at all is
    checked with the backends' capabilities.)"""
    mode, problems = job.config.actor.router_replay, []
    if mode == "R2" and job.config.algorithm.rollout_bypass:
        problems.append("actor.router_replay = 'R2' replays the choices of the old log-prob pass, which bypass mode "
                        "(algorithm.rollout_bypass) skips: use 'R3' (the engine's choices) or leave bypass off")
    if mode == "R3" and not job.config.rollout.return_routed_experts:
        problems.append("actor.router_replay = 'R3' replays the rollout engine's choices: set "
                        "rollout.return_routed_experts = true (verl: "
                        "actor_rollout_ref.rollout.enable_rollout_routing_replay=True)")
    return problems
