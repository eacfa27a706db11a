"""Router replay (actor.router_replay) on the fsdp backend, with a tiny Qwen3-MoE: R2 records the old
log-prob pass's routing and the update routes as recorded in every micro-batch layout (row micro-batches,
token budgets, padded or packed, gradient checkpointing, torch.compile'd layers), even after the routers changed; R3 routes both
passes as the batch's column, which matches forcing those experts in transformers' own forward."""

from __future__ import annotations

import attrs
import pytest
import torch

from rlcore.batch import Batch
from rlcore.models.routing import moe_routers, tokens_of
from rlcore.testing import build_actor
from rlcore_fsdp.batching import micro_batches
from tests.fsdp.helpers import job, make_batch
from tests.fsdp.two_ranks import advantages

ROWS = 4
LAYOUTS = {  # name: (actor settings, packed, gradient checkpointing)
    "padded_rows": ({"ppo_micro_batch_size_per_gpu": 2}, False, False),
    "packed_rows": ({"ppo_micro_batch_size_per_gpu": 2}, True, False),
    "packed_token_budget": ({"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 20}, True, False),
    "padded_checkpointed": ({"ppo_micro_batch_size_per_gpu": 2}, False, True),
    "padded_compiled": ({"ppo_micro_batch_size_per_gpu": 2, "use_torch_compile": True}, False, False),
}


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("moe") / "tiny-qwen3-moe", family="qwen3_moe")


def moe_job(moe_path, mode: str, actor: dict | None = None, packed: bool = False, checkpointing: bool = False):
    config = job(moe_path, actor={"ppo_mini_batch_size": ROWS, "router_replay": mode, "shuffle": False,
                                  **(actor or {})})
    return attrs.evolve(config, model=attrs.evolve(config.model, use_remove_padding=packed,
                                                   enable_gradient_checkpointing=checkpointing))


def perturb_routers(actor, seed: int = 5) -> None:
    """New random router weights, so that the routers now choose other experts for many tokens."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in moe_routers(actor.module):
            local = router.weight.to_local() if hasattr(router.weight, "to_local") else router.weight
            local.copy_(torch.randn(local.shape, generator=generator) * 2)


def update_routing(actor, batch: Batch, settings: dict, packed: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The routing each micro-batch's forward of ``actor.update`` took (the first forward call of each, not
    a checkpointed recompute) and the column's routing of the same micro-batch, in the update's order."""
    with actor.routing.recording() as records:
        actor.update(batch)
    calls = len(records[0])
    budget = settings.get("ppo_max_token_len_per_gpu") if settings.get("use_dynamic_bsz") else None
    micros = micro_batches(batch, settings.get("ppo_micro_batch_size_per_gpu"), budget, packed=packed)
    per_forward = calls // len(micros)  # 2 under gradient checkpointing: the forward and its recompute
    taken = [torch.stack([records[layer][i * per_forward] for layer in range(len(records))], 1).long()
             for i in range(len(micros))]
    given = [tokens_of(m.batch["routed_experts"], m.batch["attention_mask"], packed) for m in micros]
    return taken, given


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_r2_update_routes_as_the_old_log_prob_pass_recorded_after_the_routers_changed(backend, platform, moe_path,
                                                                                      layout):
    settings, packed, checkpointing = LAYOUTS[layout]
    actor = build_actor(backend, moe_job(moe_path, "R2", settings, packed, checkpointing), platform)
    batch = make_batch(ROWS)
    old = actor.compute_log_prob(batch)
    column = old["routed_experts"]
    assert column.shape == (ROWS, batch["input_ids"].shape[1], 2, 2) and column.dtype == torch.int16
    real = batch["attention_mask"].bool()
    assert (column[real] >= 0).all() and (column[~real] == -1).all()
    step = batch.update(old).update(Batch({"advantages": advantages(ROWS)}))
    perturb_routers(actor)
    with torch.no_grad(), actor.routing.recording() as records:  # what the changed routers choose themselves
        actor.module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     position_ids=batch["position_ids"])
    own = torch.stack([torch.cat(r) for r in records], 1).view(*column.shape)
    assert (own[real] != column[real]).any(-1).float().mean() > 0.2  # many tokens would go elsewhere
    taken, given = update_routing(actor, step, settings, packed)
    for took, column_tokens in zip(taken, given):
        recorded = (column_tokens >= 0).all(-1)
        assert torch.equal(took[recorded], column_tokens[recorded])


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_r2_update_forward_before_any_step_gives_the_old_log_probs_exactly(backend, platform, moe_path, packed):
    actor = build_actor(backend, moe_job(moe_path, "R2", {"ppo_micro_batch_size_per_gpu": 2}, packed), platform)
    batch = make_batch(ROWS)
    step = batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": advantages(ROWS)}))
    metrics = actor.update(step)
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))


def test_without_replay_the_changed_routers_move_the_old_log_probs(backend, platform, moe_path):
    """The counterpart: the same change to the routers without replay changes the log-probs."""
    batch = make_batch(ROWS)
    old = build_actor(backend, moe_job(moe_path, "R2"), platform).compute_log_prob(batch)["old_log_probs"]
    plain = build_actor(backend, moe_job(moe_path, "off"), platform)
    assert plain.routing is None
    perturb_routers(plain)
    own = plain.compute_log_prob(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    assert not torch.allclose(own[mask], old[mask], atol=1e-3)


def test_padded_and_packed_forwards_replay_a_column_identically(backend, platform, moe_path):
    recorder = build_actor(backend, moe_job(moe_path, "R2"), platform)
    batch = make_batch(ROWS)
    column = recorder.compute_log_prob(batch)["routed_experts"]
    rows = batch.update(Batch({"routed_experts": column}))
    results = {}
    for packed in (False, True):
        actor = build_actor(backend, moe_job(moe_path, "R3", packed=packed), platform)
        perturb_routers(actor)  # the same change in both: replay alone decides the experts
        with actor.routing.recording() as records:
            results[packed] = actor.compute_log_prob(rows)
        taken = torch.stack([torch.cat(r) for r in records], 1).long()
        real = batch["attention_mask"].bool()
        assert torch.equal(taken if packed else taken.view(*column.shape)[real], column[real].long())
        assert "routed_experts" not in results[packed]  # R3: the pass does not overwrite the engine's column
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(results[True]["old_log_probs"][mask], results[False]["old_log_probs"][mask],
                               atol=1e-5, rtol=1e-5)


def forced_log_probs(model_path, batch: Batch, column: torch.Tensor) -> torch.Tensor:
    """log p(response) (B, R) from transformers' unsharded model whose routers are replaced by functions
    that send each token to the column's experts, weighted by the softmax there (renormalised over them
    with ``norm_topk_prob``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    experts = column.flatten(0, 1).long()  # (B * T, L, K): the padded forward's token order

    def forcing(router, layer):
        def forward(hidden):
            logits = hidden.reshape(-1, router.hidden_dim) @ router.weight.T
            chosen = experts[:, layer]
            weights = logits.softmax(-1).gather(-1, chosen)
            return logits, weights / weights.sum(-1, keepdim=True) if router.norm_topk_prob else weights, chosen
        return forward

    for layer, block in enumerate(model.model.layers):
        block.mlp.gate.forward = forcing(block.mlp.gate, layer)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    responses = batch["responses"]
    return logits[:, -responses.shape[1] - 1:-1].log_softmax(-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def test_r3_routes_as_a_hand_made_column_which_matches_forcing_those_experts(backend, platform, moe_path):
    batch = make_batch(ROWS)
    width = batch["input_ids"].shape[1]
    # every token of layer 0 to experts (3, 2), of layer 1 to (1, 0); the pads are left to the router
    column = torch.tensor([[3, 2], [1, 0]], dtype=torch.int16).expand(ROWS, width, 2, 2).clone()
    column[~batch["attention_mask"].bool()] = -1
    plain = build_actor(backend, moe_job(moe_path, "off"), platform).compute_log_prob(batch)["old_log_probs"]
    actor = build_actor(backend, moe_job(moe_path, "R3"), platform)
    replayed = actor.compute_log_prob(batch.update(Batch({"routed_experts": column})))["old_log_probs"]
    forced_column = torch.where(column >= 0, column, torch.tensor([[0, 1], [0, 1]], dtype=torch.int16))
    expected = forced_log_probs(moe_path, batch, forced_column)
    mask = batch["response_mask"].bool()
    assert not torch.allclose(replayed[mask], plain[mask], atol=1e-3)
    # pads route as the router likes in the replay and to (0, 1) in the reference: they are masked out of
    # attention, so they change no real token's log-prob
    torch.testing.assert_close(replayed[mask], expected[mask], atol=1e-5, rtol=1e-5)


def test_replaying_passes_need_the_column(backend, platform, moe_path):
    from rlcore.errors import RlcoreError

    actor = build_actor(backend, moe_job(moe_path, "R3"), platform)
    batch = make_batch(ROWS).update(Batch({"advantages": advantages(ROWS)}))
    with pytest.raises(RlcoreError, match="actor.update needs batch keys routed_experts"):
        actor.update(batch)
    with pytest.raises(RlcoreError, match="actor.compute_log_prob needs batch keys routed_experts"):
        actor.compute_log_prob(batch)


def test_ulysses_ranks_record_and_replay_the_one_rank_routing(backend, platform, moe_path, tmp_path):
    """Two ranks, one sequence-parallel group: each records its piece of the packed row and the pieces are
    gathered into the one-rank column; a replayed column is cut into the same pieces."""
    from tests.fsdp import router_replay_ranks as ranks
    from tests.fsdp.two_ranks import ROWS as BOTH
    from tests.ranks import run_ranks

    run_ranks("tests.fsdp.router_replay_ranks", str(moe_path), str(tmp_path))
    split = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    batch = make_batch(BOTH)
    one = build_actor(backend, ranks.config(moe_path, "R2", 1), platform).compute_log_prob(batch)
    real = batch["attention_mask"].bool()
    column = torch.cat([split[0]["column"], split[1]["column"]])
    assert (column[~real] == -1).all() and torch.equal(column[real], one["routed_experts"][real])
    mask = batch["response_mask"].bool()
    log_probs = torch.cat([split[0]["log_probs"], split[1]["log_probs"]])
    torch.testing.assert_close(log_probs[mask], one["old_log_probs"][mask], atol=1e-5, rtol=1e-5)
    # the update's forward replays the recorded routing: the old log-probs up to the rounding of other
    # micro-batch shapes (3 pooled rows against the old log-prob pass's)
    assert abs(split[0]["metrics"]["actor/ppo_kl"]) < 1e-6 and split[0]["metrics"]["actor/pg_clipfrac"] == 0.0
    r3 = build_actor(backend, ranks.config(moe_path, "R3", 1), platform).compute_log_prob(
        batch.update(Batch({"routed_experts": ranks.hand_made_column(batch)})))["old_log_probs"]
    replayed = torch.cat([split[0]["r3_log_probs"], split[1]["r3_log_probs"]])
    torch.testing.assert_close(replayed[mask], r3[mask], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(replayed[mask], one["old_log_probs"][mask], atol=1e-3)
