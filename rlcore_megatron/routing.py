"""Router replay (``actor.router_replay``) in the megatron backend: record the experts each MoE router
of this rank picks, or make it pick the experts the batch column ``routed_experts`` names.

megatron-core's ``TopKRouter`` calls its ``router_replay`` slot for every top-k it takes
(``get_replay_topk``, with the default top-k as an argument). megatron-core's own ``RouterReplay``
keeps one process-wide list of every router ever built, replays one tensor per layer wholesale and
needs its action switched around recomputation by hand; rlcore puts a ``RoutingTape`` of its own in
that slot instead, one per router of the actor's model: a tape replays per token (an entry < 0: the
router's own choice), and keeps each micro-batch's choices for the backward recompute of a
checkpointed layer, which the pipeline schedule may run after later micro-batches' forwards.

The router sees this rank's tokens sequence-first, (s, b) flattened: s = this rank's positions of the
micro-batch's aligned rows (its context-parallel chunks; its tensor-parallel slice under sequence
parallelism), b = the micro-batch's rows. ``RoutingReplay.start`` gives a ``RoutingPass``, which turns the column (B, P+R, L, K) into each
layer's (s x b, K) targets and back: recorded choices are put together over the model replica's
ranks (tensor, context and pipeline parallel; each stage holds its own layers) with one max-reduce.
Expert parallelism moves tokens only after the router has chosen, so it changes nothing here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlcore.api import Batch, RlcoreError, to_device
from rlcore_megatron.compute import Micro, alignment, padded_to_context_chunks
from rlcore_megatron.model import model_replica_group

NOT_RECORDED = -1


class RoutingTape:
    """What one router's top-k does: its own choice (``off``), its own choice kept (``record``), or
    the ``target`` (tokens, K) where it is >= 0 (``replay``)."""

    def __init__(self):
        self.layer_number: int | None = None  # set by the router, as for megatron-core's RouterReplay
        self.mode = "off"
        self.recorded: list[Tensor] = []  # (tokens, K) per micro-batch, in forward order
        self.target: Tensor | None = None  # the micro-batch in forward
        self.keep_for_recompute = False  # an update: a checkpointed layer's forward runs again in backward
        self.for_recompute: deque[Tensor] = deque()

    def reset(self, mode: str, training: bool) -> None:
        self.mode, self.keep_for_recompute = mode, training
        self.recorded, self.target, self.for_recompute = [], None, deque()

    def get_replay_topk(self, scores: Tensor, topk: int, num_groups=None, group_topk=None,
                        default_compute_topk=None) -> tuple[Tensor, Tensor]:
        probs, chosen = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        if self.mode == "record":
            self.recorded.append(chosen.detach())
            return probs, chosen
        if self.mode != "replay":
            return probs, chosen
        target = self._target()
        if target.shape != chosen.shape:
            raise RlcoreError(f"router replay: layer {self.layer_number} routes {tuple(chosen.shape)} (tokens, "
                              f"experts per token) but was given {tuple(target.shape)}")
        chosen = torch.where(target >= 0, target, chosen)
        return scores.gather(1, chosen), chosen

    def _target(self) -> Tensor:
        if torch.is_grad_enabled() and self.for_recompute:  # the backward recompute of a checkpointed layer
            return self.for_recompute.popleft()
        if not torch.is_grad_enabled() and self.keep_for_recompute:  # a checkpointed layer's first forward
            self.for_recompute.append(self.target)
        return self.target


def token_positions(width: int, sequence_parallel: bool, device: torch.device) -> Tensor:
    """(s,) the aligned positions (of a row ``width`` wide before the context-parallel split) whose
    tokens this rank's routers see, in their order."""
    from megatron.core import parallel_state as ps

    from rlcore_megatron.context_parallel import local_positions

    cp = ps.get_context_parallel_world_size()
    positions = local_positions(width, cp, ps.get_context_parallel_rank()) if cp > 1 else torch.arange(width)
    if sequence_parallel:  # the router sees this tensor-parallel rank's slice of the sequence
        tp = ps.get_tensor_model_parallel_world_size()
        positions = positions.chunk(tp)[ps.get_tensor_model_parallel_rank()]
    return to_device(positions, device)


class RoutingReplay:
    """The tapes of one model's routers on this stage and the MoE layer (0-based, over all stages) of each."""

    def __init__(self, model: nn.Module, num_layers: int, top_k: int):
        from megatron.core.transformer.moe.router import TopKRouter

        routers = [module for module in model.modules() if isinstance(module, TopKRouter)]
        if not routers:
            raise RlcoreError("actor.router_replay needs a mixture-of-experts model; this one has no router")
        self.num_layers, self.top_k = num_layers, top_k
        self.sequence_parallel = bool(routers[0].config.sequence_parallel)
        self.layers = [router.layer_number - 1 for router in routers]
        self.tapes = []
        for router in routers:
            tape = RoutingTape()
            tape.layer_number = router.layer_number
            router.router_replay = tape
            self.tapes.append(tape)

    def start(self, mode: str, *, training: bool) -> RoutingPass:
        """One pass through the model: ``record`` or ``replay`` (the micro-batches carry ``routed_experts``)."""
        for tape in self.tapes:
            tape.reset(mode, training)
        return RoutingPass(self, mode)

    def stop(self) -> None:
        for tape in self.tapes:
            tape.reset("off", False)


class RoutingPass:
    """Feeds the tapes micro-batch by micro-batch (``feed``, before the stage's forward) and, recording,
    gives the column of the rows it saw (``column``)."""

    def __init__(self, replay: RoutingReplay, mode: str):
        self.replay, self.mode = replay, mode
        self.positions: list[Tensor] = []

    def feed(self, micro: Micro, width: int, device: torch.device) -> None:
        """Before the micro-batch's forward on this stage; ``width``: its length padded for context parallelism."""
        positions = token_positions(width, self.replay.sequence_parallel, device)
        self.positions.append(positions)
        if self.mode != "replay":
            return
        if micro.routed_experts is None:
            raise RlcoreError("router replay: the micro-batch carries no routed_experts column")
        column = micro.routed_experts  # (b, Lm, L, K)
        column = torch.nn.functional.pad(column, (0, 0, 0, 0, 0, width - column.shape[1]), value=NOT_RECORDED)
        mine = column[:, positions.cpu()]  # (b, s, L, K)
        for tape, layer in zip(self.replay.tapes, self.replay.layers):
            tape.target = mine[:, :, layer].transpose(0, 1).reshape(-1, mine.shape[-1]).to(
                positions.device, torch.long)

    def column(self, micros: Sequence[Micro], shared: Batch, device: torch.device) -> Tensor:
        """(B, P+R, L, K) int16: the experts this pass's routers chose for ``shared``'s rows (the
        rows the micro-batches came from), < 0 where no token was (padding)."""
        replay, tapes = self.replay, self.replay.tapes
        mask = shared["attention_mask"].bool()
        starts, lengths = alignment(mask)
        result = torch.full((*mask.shape, replay.num_layers, replay.top_k), NOT_RECORDED, dtype=torch.int16)
        group = model_replica_group()
        for index, (micro, positions) in enumerate(zip(micros, self.positions)):
            rows, width = micro.input_ids.shape[0], micro.input_ids.shape[1]
            padded = padded_to_context_chunks(micro.input_ids, _context_parallel()).shape[1]
            full = torch.full((rows, padded, replay.num_layers, replay.top_k), NOT_RECORDED, dtype=torch.long,
                              device=device)
            for tape, layer in zip(tapes, replay.layers):
                chosen = tape.recorded[index].view(len(positions), rows, -1).transpose(0, 1)  # (b, s, K)
                full[:, positions, layer] = chosen.to(device, torch.long)
            if dist.get_world_size(group) > 1:  # each rank filled its positions and layers, -1 elsewhere
                dist.all_reduce(full, op=dist.ReduceOp.MAX, group=group)
            full = full[:, :width].cpu()
            for row, batch_row in enumerate(micro.rows.tolist()):
                real = int(lengths[batch_row])
                start = int(starts[batch_row])
                result[batch_row, start:start + real] = full[row, :real].to(torch.int16)
        return result


def _context_parallel() -> int:
    from megatron.core import parallel_state as ps

    return ps.get_context_parallel_world_size()
