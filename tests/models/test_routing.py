"""rlcore.models.routing on real transformers mixtures of experts built from tiny configs: what is recorded is what
the routers chose, replaying it routes a changed model as the recorded one, and the column layouts round-trip."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlcore.errors import RlcoreError
from rlcore.models.routing import ModelRouting, column_of, recorded_tokens, tokens_of

FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "decoder_sparse_step": 1, "norm_topk_prob": True}),
    "qwen2_moe": ("Qwen2MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "shared_expert_intermediate_size": 32, "decoder_sparse_step": 1}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "olmoe": ("OlmoeConfig", {"num_experts": 4, "num_experts_per_tok": 2}),
}


def tiny_moe(family: str, seed: int = 0) -> nn.Module:
    import transformers

    config_class, experts = FAMILIES[family]
    config = getattr(transformers, config_class)(
        **experts, vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for name, parameter in model.named_parameters():
        if name.endswith("gate.weight"):  # routers start at zero in some families: make them choose
            nn.init.normal_(parameter, std=1.0)
    return model.eval()


def rows(batch: int = 3, width: int = 7) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 64, (batch, width), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(batch, width, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    mask[2, -3:] = 0  # right padding
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def perturb_routers(routing: ModelRouting) -> None:
    with torch.no_grad():
        for router in routing.routers:
            router.weight.copy_(torch.randn_like(router.weight) * 3)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_replaying_the_recorded_routing_routes_a_changed_router_as_before(family):
    model = tiny_moe(family)
    routing = ModelRouting(model)
    inputs = rows()
    with torch.no_grad(), routing.recording() as records:
        before = model(**inputs).logits
    tokens = recorded_tokens(records)  # (B * T, L, K)
    assert tokens.shape == (21, 2, 2) and tokens.dtype == torch.int16
    assert (tokens >= 0).all() and (tokens < 4).all()
    perturb_routers(routing)
    with torch.no_grad():
        own = model(**inputs).logits
        with routing.recording() as records:
            model(**inputs)
        assert not torch.equal(recorded_tokens(records), tokens)  # the changed routers choose differently
        with routing.replaying(tokens.long()):
            replayed = model(**inputs).logits
        with routing.replaying(torch.full_like(tokens, -1).long()):
            unrecorded = model(**inputs).logits
    assert not torch.allclose(own, before, atol=1e-4)
    torch.testing.assert_close(unrecorded, own, rtol=0, atol=0)  # < 0: the router's own choice
    # the changed router's probabilities weigh the recorded experts, so the logits are neither the old ones
    # nor the changed model's own, but the routing is the recorded one
    with torch.no_grad(), routing.replaying(tokens.long()), routing.recording() as records:
        model(**inputs)
    assert torch.equal(recorded_tokens(records), tokens)
    assert torch.isfinite(replayed).all() and not torch.allclose(replayed, own, atol=1e-4)


def test_replay_forces_the_given_experts_with_the_routers_probabilities_and_keeps_their_gradient():
    model = tiny_moe("qwen3_moe")
    routing = ModelRouting(model)
    inputs = rows()
    forced = torch.tensor([[0, 1], [2, 3]]).expand(21, 2, 2).clone()  # (N, L, K): layer 0 -> experts 0, 1; 1 -> 2, 3
    entering_mlp = _layer0_attention_output(model, inputs)
    seen: dict[int, torch.Tensor] = {}
    for layer, block in enumerate(model.model.layers):
        block.mlp.register_forward_hook(lambda m, a, out, layer=layer: seen.__setitem__(layer, out))
    with routing.replaying(forced):
        logits = model(**inputs).logits
    logits.sum().backward()
    assert all(router.weight.grad is not None and router.weight.grad.abs().sum() > 0 for router in routing.routers)
    # the expected layer 0 output: experts 0 and 1 with the renormalised softmax weights, computed by hand
    block = model.model.layers[0].mlp
    hidden = model.model.layers[0].post_attention_layernorm(entering_mlp).view(-1, 32)
    probs = torch.softmax(hidden @ block.gate.weight.T, -1)[:, :2]
    weights = probs / probs.sum(-1, keepdim=True)
    expected = block.experts(hidden, forced[:, 0], weights)
    torch.testing.assert_close(seen[0].view(-1, 32), expected, rtol=1e-5, atol=1e-6)


def _layer0_attention_output(model, inputs) -> torch.Tensor:
    """The residual stream entering layer 0's MLP, from a hook on its post-attention norm."""
    captured = {}
    handle = model.model.layers[0].post_attention_layernorm.register_forward_pre_hook(
        lambda m, args: captured.__setitem__("x", args[0]))
    with torch.no_grad():
        model(**inputs)
    handle.remove()
    return captured["x"]


def test_a_dense_model_and_an_unknown_router_are_refused_by_name():
    import transformers

    dense = transformers.AutoModelForCausalLM.from_config(transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2))
    with pytest.raises(RlcoreError, match="Qwen2ForCausalLM has no mixture-of-experts router"):
        ModelRouting(dense)

    class HashRouter(nn.Module):  # a router whose forward does not have the top-k shape
        pass

    dense.model.layers[0].mlp.router = HashRouter()
    with pytest.raises(RlcoreError, match="Qwen2ForCausalLM routes with HashRouter"):
        ModelRouting(dense)


def test_a_column_of_the_wrong_shape_is_refused_with_both_shapes():
    routing = ModelRouting(tiny_moe("qwen3_moe"))
    with pytest.raises(RlcoreError, match="3 MoE layers x 2 experts per token; the model has 2 x 2"):
        with routing.replaying(torch.zeros(5, 3, 2, dtype=torch.long)):
            pass


@pytest.mark.parametrize("packed", [False, True])
def test_column_and_token_order_round_trip_with_pads_unrecorded(packed):
    mask = rows()["attention_mask"]
    column = torch.randint(0, 4, (3, 7, 2, 2), dtype=torch.int16)
    tokens = tokens_of(column, mask, packed)
    assert tokens.dtype == torch.int64 and tokens.shape == ((int(mask.sum()) if packed else 21), 2, 2)
    back = column_of(tokens, mask, packed)
    assert back.dtype == torch.int16
    assert torch.equal(back[mask.bool()], column[mask.bool()])
    assert (back[~mask.bool()] == -1).all()


def test_padded_and_packed_token_orders_hold_the_same_choices_for_real_tokens():
    model = tiny_moe("qwen3_moe")
    routing = ModelRouting(model)
    inputs = rows()
    with torch.no_grad(), routing.recording() as records:
        model(**inputs)
    padded = column_of(recorded_tokens(records), inputs["attention_mask"], packed=False)
    real = inputs["attention_mask"].bool()
    one_at_a_time = []
    with torch.no_grad():
        for row in range(3):  # each row's real tokens alone: the packed token order, sample by sample
            ids = inputs["input_ids"][row][real[row]].unsqueeze(0)
            with routing.recording() as records:
                model(input_ids=ids)
            one_at_a_time.append(recorded_tokens(records))
    packed = column_of(torch.cat(one_at_a_time), inputs["attention_mask"], packed=True)
    assert torch.equal(packed, padded)
