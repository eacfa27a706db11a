"""Router replay (actor.router_replay) in the megatron backend, on the CPU: the tapes rlcore puts in
megatron-core's routers, and the bookkeeping between the batch column ``routed_experts`` (B, P+R, L, K)
and what each rank's routers see, on 1 rank and on 2 gloo ranks at expert, context and pipeline
parallel 2 (``routing_ranks.py``: the routers of megatron-core's ``GPTModel`` driven by a probe, since
its forward needs CUDA). The actor's passes themselves (log-probs replayed exactly, against
transformers) are checked on GPUs: ``test_on_device.py``."""

from __future__ import annotations

import pytest
import torch

from rlcore_megatron.routing import RoutingTape
from tests.fsdp.helpers import make_batch
from tests.megatron.conftest import build_tiny_qwen3_moe, needs_megatron
from tests.ranks import run_ranks


def ascending(column: torch.Tensor) -> torch.Tensor:
    return column.long().sort(-1).values


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    # std 0.3: routers far from uniform, so a perturbation and a hand-made column change choices
    return build_tiny_qwen3_moe(tmp_path_factory.mktemp("router-replay") / "moe", std=0.3)


@pytest.fixture(scope="module")
def runs(moe_path, tmp_path_factory):
    """Each layout's saved results, by name: "one" on 1 rank, the others on 2 (rank outputs in a list). The
    three 2-rank layouts run one after the other in the same two processes (a start costs more than a run)."""
    needs_megatron()
    results = {}
    for world, names in ((1, ["one"]), (2, ["ep2", "cp2", "pp2"])):
        outs = {name: tmp_path_factory.mktemp(f"routing-{name}") for name in names}
        run_ranks("tests.megatron.routing_ranks", str(moe_path), *(str(arg) for name in names
                                                                   for arg in (name, outs[name])),
                  world=world, timeout=600)
        for name in names:
            results[name] = [torch.load(outs[name] / f"rank{rank}.pt") for rank in range(world)]
    return results


def test_the_recorded_column_is_each_layers_top_k_of_the_folders_router_and_minus_one_at_pads(runs, moe_path):
    """Derived without megatron-core: the probe's hidden state of a token is row ``id`` of a seeded table,
    so the expected choice is the top 2 of (that row @ the folder's gate weight of the layer)."""
    from safetensors.torch import load_file

    from tests.megatron.routing_ranks import ROWS, SEED

    (one,) = runs["one"]
    recorded = one["recorded"]
    batch = make_batch(ROWS, seed=3)
    assert recorded.shape == (ROWS, batch["input_ids"].shape[1], 2, 2) and recorded.dtype == torch.int16
    mask = batch["attention_mask"].bool()
    assert (recorded[mask] >= 0).all() and (recorded[~mask] == -1).all()
    tensors = load_file(str(next(moe_path.glob("*.safetensors"))))
    table = torch.randn(len(tensors["model.embed_tokens.weight"]), 64, generator=torch.Generator().manual_seed(SEED))
    checked = 0
    for layer in range(2):
        logits = table[batch["input_ids"]] @ tensors[f"model.layers.{layer}.mlp.gate.weight"].T  # (B, T, E)
        top = logits.topk(3, dim=-1)
        clear = mask & (top.values[..., 1] - top.values[..., 2] > 1e-4)  # no near-tie for the second place
        expected = top.indices[..., :2].sort(-1).values
        assert torch.equal(ascending(recorded[:, :, layer])[clear], expected[clear])
        checked += int(clear.sum())
    assert checked > 0.9 * 2 * int(mask.sum())


def test_replaying_the_recorded_column_routes_as_recorded_after_the_routers_changed(runs):
    (one,) = runs["one"]
    real = (one["recorded"] >= 0).all(-1)
    assert torch.equal(ascending(one["replayed"]), ascending(one["recorded"]))
    changed = (ascending(one["own"]) != ascending(one["recorded"])).any(-1) & real
    assert changed.sum() > 0.3 * real.sum()  # without replay the changed routers choose otherwise


def test_a_hand_made_column_forces_its_experts_and_its_holes_keep_the_routers_choice(runs):
    (one,) = runs["one"]
    real = (one["recorded"] >= 0).all(-1)
    made, used = one["made"], one["made_used"]
    forced, holes = real & (made >= 0).all(-1), real & (made < 0).all(-1)
    assert forced.any() and holes.any()
    assert torch.equal(ascending(used)[forced], ascending(made)[forced])
    assert torch.equal(ascending(used)[holes], ascending(one["own"])[holes])


@pytest.mark.parametrize("layout", ["ep2", "cp2", "pp2"])
def test_two_ranks_record_and_replay_the_same_column_as_one(runs, layout):
    (one,) = runs["one"]
    ranks = runs[layout]
    rows = torch.cat([rank["rows"] for rank in ranks]) if layout == "ep2" else ranks[0]["rows"]
    assert sorted(rows.tolist()) == list(range(len(one["recorded"])))
    for rank in ranks:
        mine = rank["rows"]
        assert torch.equal(rank["recorded"], one["recorded"][mine])
        assert torch.equal(ascending(rank["replayed"]), ascending(one["recorded"][mine]))
        assert torch.equal(ascending(rank["own"]), ascending(one["own"][mine]))
        assert torch.equal(ascending(rank["made_used"]), ascending(one["made_used"][mine]))
    if layout == "pp2":  # each stage holds one of the two layers; the column has both
        assert [rank["layers"] for rank in ranks] == [[0], [1]]


def default_top_k(scores, topk, num_groups=None, group_topk=None):
    return torch.topk(scores, k=topk, dim=1)


def test_a_checkpointed_layer_recomputed_after_later_forwards_replays_its_own_micro_batch():
    """Under pipeline parallelism with activation recompute, micro-batch 0's backward (and the recompute
    of its checkpointed layers, with gradients on) can come after micro-batch 1's forward (without)."""
    tape = RoutingTape()
    tape.reset("replay", training=True)
    scores = torch.tensor([[0.1, 0.5, 0.2, 0.9], [0.8, 0.1, 0.3, 0.2]])
    targets = [torch.tensor([[0, 2], [-1, -1]]), torch.tensor([[1, 3], [2, 3]])]
    chosen = []
    with torch.no_grad():
        for target in targets:  # the first forwards of a checkpointed layer
            tape.target = target
            chosen.append(tape.get_replay_topk(scores, 2, default_compute_topk=default_top_k)[1])
    with torch.enable_grad():  # the recomputes, in micro-batch order
        recomputed = [tape.get_replay_topk(scores, 2, default_compute_topk=default_top_k)[1] for _ in targets]
    assert chosen[0].tolist() == [[0, 2], [0, 2]]  # row 1: -1, the router's own top 2 (0.8, 0.3)
    assert [c.tolist() for c in recomputed] == [c.tolist() for c in chosen]
    assert not tape.for_recompute
    with torch.enable_grad():  # a layer that is not checkpointed: the micro-batch in forward
        tape.target = targets[1]
        probs, again = tape.get_replay_topk(scores, 2, default_compute_topk=default_top_k)
    assert again.tolist() == [[1, 3], [2, 3]]
    assert torch.equal(probs, scores.gather(1, again))  # the router's scores at the replayed experts


def test_a_replayed_column_of_the_wrong_shape_is_refused_naming_the_layer():
    from rlcore.errors import RlcoreError

    tape = RoutingTape()
    tape.layer_number = 3
    tape.reset("replay", training=False)
    tape.target = torch.zeros(5, 2, dtype=torch.long)
    with pytest.raises(RlcoreError, match=r"layer 3 routes \(2, 2\) .* given \(5, 2\)"):
        tape.get_replay_topk(torch.rand(2, 4), 2, default_compute_topk=default_top_k)


def test_a_megatron_job_takes_r2_and_r3_needs_the_engines_column():
    """The backend declares replays_routing, so the config checks let R2 through; R3 still needs an engine
    that returns its choices (no installed engine does yet on this branch, so the check names it)."""
    from rlcore.config import load_job
    from rlcore.errors import ConfigError

    def replay_problems(*overrides: str) -> list[str]:
        try:
            load_job(None, ["trainer.backend=megatron", *overrides], check=True)
        except ConfigError as exc:
            return [problem for problem in exc.problems if "router_replay" in problem or "routed_experts" in problem]
        return []

    assert replay_problems("actor.router_replay=R2") == []
    assert any("set rollout.return_routed_experts = true" in p for p in replay_problems("actor.router_replay=R3"))
