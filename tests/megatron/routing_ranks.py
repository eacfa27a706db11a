"""Router replay's bookkeeping on the CPU, one process of ``tests.ranks.run_ranks`` (gloo; or alone, world
size 1): megatron-core's ``GPTModel`` of the tiny Qwen3-MoE folder argv[1] at each layout named after
it ("one", "ep2", "cp2" or "pp2", each followed by its output folder), one layout after the other (each
set up and torn down, the random state as a fresh process has it: a process start costs more than a
layout's run), its routers driven by a ``RouterProbe`` in place of the transformer
body (megatron-core's forward needs CUDA): every token's hidden state is a fixed random vector of its
token id, the same on every rank and in every layer, so each router's choice for a token depends on
the token and the layer only, wherever the layout puts it.

Each rank (1) records the routing of the batch through the micro-batches as the old log-prob pass
does (the column rlcore returns), (2) perturbs every router and replays that column, reading back the
experts the routers used, (3) replays a hand-made column with holes (-1: the router's own choice).
Rank r saves to the layout's folder, as rank{r}.pt, with the rows it was given (its data-parallel share)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from tests.fsdp.helpers import make_batch

ROWS, SEED = 6, 5


class RouterProbe(nn.Module):
    """Called as the forward step calls the model; runs this stage's routers (in layer order) on the hidden
    states ``table[input_ids]`` (s, b, h) and keeps the experts each one sent each token to."""

    def __init__(self, routers: list[nn.Module], config, hidden_size: int, vocab: int):
        super().__init__()
        self.routers, self.config = routers, config
        self.table = torch.randn(vocab, hidden_size, generator=torch.Generator().manual_seed(SEED))
        self.used: list[list[torch.Tensor]] = []  # per call: per router (tokens, K) expert ids, ascending

    def forward(self, input_ids, position_ids=None, attention_mask=None):
        hidden = self.table[input_ids].transpose(0, 1).contiguous()  # (s, b, h)
        used = []
        for router in self.routers:
            # the router's own gating moves its weight to a GPU: the same linear map here, then its routing
            _, routing_map = router.routing(nn.functional.linear(hidden, router.weight))  # (s x b, E) bool
            tokens = routing_map.shape[0]
            used.append(routing_map.nonzero()[:, 1].view(tokens, -1))
        self.used.append(used)
        return hidden.new_zeros(input_ids.shape[0], input_ids.shape[1], 1)


def drive(probe: RouterProbe, micros, routing) -> None:
    """Every micro-batch through the probe as ``run_schedule``'s forward step sends it to each stage
    (megatron-core's schedule itself needs CUDA): padded to whole context-parallel chunks, the tapes fed,
    this rank's chunks to the stage. Each stage's probe computes its input itself: no activations travel."""
    from megatron.core import parallel_state as ps

    from rlcore_megatron.compute import padded_to_context_chunks
    from rlcore_megatron.context_parallel import split_sequence

    cp, cp_rank = ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()
    probe.used.clear()
    for micro in micros:
        input_ids = padded_to_context_chunks(micro.input_ids, cp)
        if routing is not None:
            routing.feed(micro, input_ids.shape[1], torch.device("cpu"))
        probe(split_sequence(input_ids, cp, cp_rank) if cp > 1 else input_ids)


def used_column(replay, probe: RouterProbe, micros, shared):
    """(B, P+R, L, K): the experts the routers used in the probe's last run (ascending per token), put
    together as a recorded column is (the same pass bookkeeping, fed the probe's readings)."""
    reading = replay.start("record", training=False)
    runs = probe.used[:]
    drive(probe, micros, reading)  # the positions each rank holds, fed as before
    for index, tape in enumerate(replay.tapes):
        tape.recorded = [run[index] for run in runs]
    column = reading.column(micros, shared, torch.device("cpu"))
    replay.stop()
    return column


def build_stage(shape, layout):
    """This rank's stage of the model. At pipeline parallel 2 rlcore refuses the CPU's allgather
    dispatcher (the pipeline's exchange needs fixed lengths) and megatron-core's alltoall one needs CUDA;
    the probe dispatches no tokens, so the stage is built with the checks of one stage, then its
    pipeline size."""
    import rlcore_megatron.model as model_module
    from rlcore_megatron.model import build_model

    if layout.pipeline_parallel == 1:
        return build_model(shape, layout, torch.float32, torch.device("cpu"))
    checked = model_module.transformer_config_kwargs

    def staged(shape, **kwargs):
        stages = kwargs.pop("pipeline_parallel")
        return {**checked(shape, pipeline_parallel=1, **kwargs), "pipeline_model_parallel_size": stages}

    model_module.transformer_config_kwargs = staged
    try:
        return build_model(shape, layout, torch.float32, torch.device("cpu"))
    finally:
        model_module.transformer_config_kwargs = checked


def main(out: str, model_path: str, layout_name: str) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.moe.router import TopKRouter

    from rlcore.batch import Batch
    from rlcore_megatron.compute import micro_batches, plan_micro_batches, share_within_model_parallel
    from rlcore_megatron.model import HfCheckpoint, current_layout, load_hf_weights, shape_of
    from rlcore_megatron.routing import RoutingReplay
    from rlcore_megatron.trained import MODEL_INPUTS

    sizes = {"one": {}, "ep2": {"expert_model_parallel_size": 2}, "cp2": {"context_parallel_size": 2},
             "pp2": {"pipeline_model_parallel_size": 2}}[layout_name]
    ps.initialize_model_parallel(**sizes)
    layout = current_layout()
    _, shape = shape_of(model_path, False)
    model = build_stage(shape, layout)
    load_hf_weights(model, HfCheckpoint(model_path), shape, layout)
    replay = RoutingReplay(model, shape.num_layers, shape.experts.top_k)
    routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
    probe = RouterProbe(routers, model.config, shape.hidden_size, shape.vocab_size)

    batch = make_batch(ROWS, seed=3)
    share = torch.arange(ROWS).chunk(layout.data_parallel)[ps.get_data_parallel_rank()]
    batch = batch.select(share)  # what the worker group hands this rank
    shared, mine = share_within_model_parallel(batch, MODEL_INPUTS, torch.device("cpu"))
    # a token budget (verl's dynamic batch size): rows grouped by length, out of their order
    plan = plan_micro_batches(shared, None, 30, "a token budget")

    # (1) record, as the old log-prob pass does
    recording = replay.start("record", training=False)
    micros = micro_batches(shared, plan, ())
    drive(probe, micros, recording)
    recorded = recording.column(micros, shared, torch.device("cpu"))
    replay.stop()

    # (2) other router weights: their own choice, and the recorded column replayed
    with torch.no_grad():
        for router in routers:
            router.weight.add_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(7)))
    drive(probe, micros, None)
    own = used_column(replay, probe, micros, shared)
    with_column = micro_batches(shared.update(Batch({"routed_experts": recorded})), plan, ("routed_experts",))
    drive(probe, with_column, replay.start("replay", training=False))
    replay.stop()
    replayed = used_column(replay, probe, micros, shared)

    # (3) a hand-made column: experts (position + layer) % E and the next, -1 (own choice) at odd positions
    experts = shape.experts.count
    positions = torch.arange(recorded.shape[1])[None, :, None, None]
    layers = torch.arange(shape.num_layers)[None, None, :, None]
    made = ((positions + layers + torch.arange(2)[None, None, None]) % experts).expand_as(recorded).clone()
    made[:, 1::2] = -1
    made = made.to(torch.int16)
    with_made = micro_batches(shared.update(Batch({"routed_experts": made})), plan, ("routed_experts",))
    drive(probe, with_made, replay.start("replay", training=False))
    replay.stop()
    made_used = used_column(replay, probe, micros, shared)

    torch.save({"rows": share, "recorded": recorded[mine], "layers": replay.layers, "own": own[mine],
                "replayed": replayed[mine], "made": made[mine], "made_used": made_used[mine]},
               Path(out) / f"rank{dist.get_rank()}.pt")
    ps.destroy_model_parallel()


if __name__ == "__main__":
    dist.init_process_group("gloo")
    fresh = torch.random.get_rng_state()
    for index in range(2, len(sys.argv), 2):
        torch.random.set_rng_state(fresh)
        main(sys.argv[index + 1], sys.argv[1], sys.argv[index])
    dist.destroy_process_group()
