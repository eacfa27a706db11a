"""LoRA on the fsdp actor (``model.lora_rank``): only the adapters train, and everything that leaves
the actor as a model (rollout weights, checkpoints, ``rlcore export``) is the merged plain model."""

from __future__ import annotations

import json

import attrs
import pytest
import torch
from torch import nn

from rlcore.batch import Batch
from rlcore.cli import main
from rlcore.config import load_job
from rlcore.config.schema import ModelConfig
from rlcore.errors import RlcoreError
from rlcore.plugins.manager import PluginManager
from rlcore.testing import build_actor, build_critic, build_tiny_model
from rlcore_fsdp.checkpoint import saved_keys
from rlcore_fsdp.lora import LoraLinear, add_lora
from tests.fsdp.helpers import RESPONSE_LENGTH, evolve, full_weights, job, make_batch


def lora_job(model_path, *, rank: int = 4, targets=("all-linear",), lr: float = 1e-2):
    config = job(model_path, lr=lr)
    return evolve(config, model={"lora_rank": rank, "lora_alpha": 8.0, "target_modules": tuple(targets)})


def log_probs_of(model: nn.Module, batch: Batch) -> torch.Tensor:
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        logits = model(**inputs).logits[:, -RESPONSE_LENGTH - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def trained(backend, platform, model_path, steps: int = 3, **options):
    actor = build_actor(backend, lora_job(model_path, **options), platform)
    batch = make_batch(4)
    for _ in range(steps):
        metrics = actor.update(batch.update(actor.compute_log_prob(batch)).update(
            Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)})))
        assert metrics["actor/grad_norm"] > 0
    return actor, batch


def test_a_lora_layer_is_its_base_plus_the_scaled_low_rank_product():
    torch.manual_seed(0)
    base = nn.Linear(6, 5)
    layer = LoraLinear(base, rank=2, alpha=4.0)
    x = torch.randn(3, 6)
    assert torch.equal(layer(x), base(x))  # B starts at zero
    with torch.no_grad():
        layer.lora_B.normal_()
    merged = base.weight + 2.0 * layer.lora_B @ layer.lora_A
    torch.testing.assert_close(layer(x), x @ merged.t() + base.bias)
    assert not base.weight.requires_grad and layer.lora_A.requires_grad and layer.lora_B.requires_grad


def test_target_modules_pick_layers_by_name_and_a_name_that_matches_nothing_lists_the_names(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    wrapped = add_lora(model, ModelConfig(path=str(tiny_model_path), lora_rank=2, target_modules=("q_proj", "v_proj")))
    assert wrapped and all(name.endswith((".q_proj", ".v_proj")) for name in wrapped)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        f"{name}.lora_{ab}" for name in wrapped for ab in "AB"}
    everything = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    all_linear = add_lora(everything, ModelConfig(path=str(tiny_model_path), lora_rank=2))
    assert "lm_head" not in all_linear and any(name.endswith(".down_proj") for name in all_linear)
    with pytest.raises(RlcoreError, match=r"matches no linear layer .* named \[.*'q_proj'"):
        add_lora(AutoModelForCausalLM.from_pretrained(tiny_model_path),
                 ModelConfig(path=str(tiny_model_path), lora_rank=2, target_modules=("query",)))


def test_exclude_modules_leaves_the_layers_whose_full_name_matches_without_adapters(tiny_model_path):
    """verl's ``model.exclude_modules`` (PEFT's regular expression): here layer 0's MLP stays plain."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    wrapped = add_lora(model, ModelConfig(path=str(tiny_model_path), lora_rank=2,
                                          lora_exclude_modules=r".*layers\.0\.mlp\..*"))
    assert not [name for name in wrapped if name.startswith("model.layers.0.mlp.")]
    assert "model.layers.0.self_attn.q_proj" in wrapped and "model.layers.1.mlp.down_proj" in wrapped
    assert type(model.get_submodule("model.layers.0.mlp.down_proj")).__name__ == "Linear"
    job = load_job(None, ["actor_rollout_ref.model.exclude_modules=.*visual.*"], manager=PluginManager(), check=False)
    assert job.config.model.lora_exclude_modules == ".*visual.*"


def test_only_the_adapters_train_and_the_rollout_gets_the_merged_plain_model(backend, platform, tiny_model_path):
    from transformers import AutoModelForCausalLM

    untouched = full_weights(build_actor(backend, lora_job(tiny_model_path), platform))
    actor, batch = trained(backend, platform, tiny_model_path)
    trained_names = {name for group in actor.optimizer.param_groups for name, p in actor.module.named_parameters()
                     if any(p is q for q in group["params"])}
    assert trained_names and all(name.endswith((".lora_A", ".lora_B")) for name in trained_names)
    after = full_weights(actor)
    for name, value in untouched.items():  # base weights bit for bit; adapters B moved off zero
        if name.endswith(".lora_B"):
            assert after[name].abs().max() > 0, name
        elif not name.endswith(".lora_A"):
            assert torch.equal(after[name], value), name

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    rollout = {name: tensor.cpu() for bucket in actor.weights_for_rollout(1 << 20) for name, tensor in bucket}
    assert set(rollout) == {name for name, _ in plain.named_parameters()}
    plain.load_state_dict(rollout, strict=False)
    mask = batch["response_mask"].bool()
    actor_log_probs = actor.compute_log_prob(batch)["old_log_probs"]
    torch.testing.assert_close(log_probs_of(plain, batch)[mask], actor_log_probs[mask], atol=1e-5, rtol=1e-5)
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    assert (log_probs_of(fresh, batch)[mask] - actor_log_probs[mask]).abs().max() > 1e-3  # it did train
    with actor.generation_module() as module:  # the hf engine generates with the adapted module itself
        torch.testing.assert_close(log_probs_of(module, batch)[mask], actor_log_probs[mask], atol=1e-5, rtol=1e-5)


def test_a_lora_checkpoint_resumes_and_exports_as_the_merged_model(backend, platform, tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    actor, batch = trained(backend, platform, tiny_model_path, steps=2)
    actor.save(str(tmp_path / "global_step_2" / "actor"))
    saved_log_probs = actor.compute_log_prob(batch)["old_log_probs"]
    state = json.loads((tmp_path / "global_step_2" / "actor" / "state.json").read_text())
    assert state["lora"] == {"rank": 4, "alpha": 8.0} and state["base_model"] == str(tiny_model_path)
    stored = {k for k in saved_keys(tmp_path / "global_step_2" / "actor") if k.startswith("model.")}
    assert stored and all(k.endswith((".lora_A", ".lora_B")) for k in stored)  # the frozen base is model.path's

    resumed = build_actor(backend, lora_job(tiny_model_path), platform)
    resumed.load(str(tmp_path / "global_step_2" / "actor"))
    for name, value in full_weights(actor).items():
        assert torch.equal(full_weights(resumed)[name], value), name
    step = batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)}))
    assert resumed.update(step) == actor.update(step)  # the same Adam moments of the adapters

    assert main(["export", str(tmp_path / "global_step_2"), "--to", str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(log_probs_of(exported, batch)[mask], saved_log_probs[mask], atol=1e-5, rtol=1e-5)
    with pytest.raises(RlcoreError, match="do not fit the model"):  # adapters into a model without them
        build_actor(backend, job(tiny_model_path), platform).load(str(tmp_path / "global_step_2" / "actor"))
    other = build_tiny_model(tmp_path / "other-base", seed=5)  # same shapes, other weights
    with pytest.raises(RlcoreError, match="holds LoRA adapters trained on .*tiny-qwen2.*, but this job's model is"):
        build_actor(backend, lora_job(other), platform).load(str(tmp_path / "global_step_2" / "actor"))


def test_the_reference_of_a_lora_actor_is_its_base_model_without_a_second_copy(backend, platform, tiny_model_path):
    from transformers import AutoModelForCausalLM

    from rlcore_fsdp.actor import LoraBaseReference

    assert build_actor(backend, job(tiny_model_path), platform).reference_view() is None  # no LoRA: a reference of its own
    actor, batch = trained(backend, platform, tiny_model_path)
    reference = actor.reference_view()
    assert isinstance(reference, LoraBaseReference) and reference.actor is actor
    mask = batch["response_mask"].bool()
    base = log_probs_of(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval(), batch)
    torch.testing.assert_close(reference.compute_ref_log_prob(batch)["ref_log_prob"][mask], base[mask],
                               atol=1e-5, rtol=1e-5)
    trained_log_probs = actor.compute_log_prob(batch)["old_log_probs"]  # the adapters are back on afterwards
    assert (trained_log_probs[mask] - base[mask]).abs().max() > 1e-3


def test_a_lora_critic_trains_adapters_and_its_whole_value_head_and_exports_merged(backend, platform,
                                                                                   tiny_model_path, tmp_path):
    """verl's critic.model.lora_rank: adapters on the backbone, the new value head trained whole."""
    from transformers import AutoModelForTokenClassification

    from rlcore_fsdp.export import export_checkpoint

    config = job(tiny_model_path, critic={"ppo_micro_batch_size_per_gpu": 2, "cliprange_value": 10.0})
    config = evolve(config, critic={"model": attrs.evolve(config.critic.model, lora_rank=4)})
    plain, critic = build_critic(backend, job(tiny_model_path), platform), build_critic(backend, config, platform)
    batch = make_batch(4)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(critic.compute_values(batch)["values"], plain.compute_values(batch)["values"])
    trained_names = {name for name, p in critic.module.named_parameters() if p.requires_grad}
    assert trained_names == {n for n in trained_names if n.endswith((".lora_A", ".lora_B")) or n.startswith("score.")}
    assert {"score.weight"} <= trained_names and any(n.endswith(".lora_A") for n in trained_names)

    returns = torch.linspace(-1.0, 1.0, 4).unsqueeze(-1).expand(4, RESPONSE_LENGTH).contiguous()
    losses = [critic.update(batch.update(critic.compute_values(batch)).update(Batch({"returns": returns})))[
        "critic/vf_loss"] for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0]

    critic.save(str(tmp_path / "step" / "critic"))
    stored = {k for k in saved_keys(tmp_path / "step" / "critic") if k.startswith("model.")}
    assert stored == {f"model.{name}" for name in trained_names}  # adapters and the value head
    export_checkpoint(str(tmp_path / "step"), str(tmp_path / "critic-hf"), role="critic")
    model = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic-hf").eval()
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        exported = model(**inputs).logits[:, -RESPONSE_LENGTH - 1:-1, 0]
    torch.testing.assert_close(exported[mask], critic.compute_values(batch)["values"][mask], atol=1e-5, rtol=1e-5)


def _peft_adapter(directory, model_path, rank: int = 2, alpha: float = 6.0) -> dict:
    """A PEFT-format adapter on q_proj and v_proj with random A and B, written by hand (PEFT's file
    names and keys); returns its tensors by PEFT name."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    shape = AutoConfig.from_pretrained(model_path)
    head_dim = shape.hidden_size // shape.num_attention_heads
    outs = {"q_proj": shape.num_attention_heads * head_dim, "v_proj": shape.num_key_value_heads * head_dim}
    g = torch.Generator().manual_seed(3)
    tensors = {}
    for layer in range(shape.num_hidden_layers):
        for proj, out in outs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, shape.hidden_size, generator=g) * 0.1
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=g) * 0.1
    directory.mkdir()
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": ["q_proj", "v_proj"]}))
    return tensors


def test_an_adapter_folder_starts_the_actor_from_its_weights(backend, platform, tiny_model_path, tmp_path):
    """verl's model.lora_adapter_path: the actor computes as base + (alpha / r) B A of the adapter."""
    from transformers import AutoModelForCausalLM

    tensors = _peft_adapter(tmp_path / "adapter", tiny_model_path)
    config = evolve(job(tiny_model_path), model={"lora_adapter_path": str(tmp_path / "adapter")})
    actor = build_actor(backend, config, platform)
    assert actor.lora == {"rank": 2, "alpha": 6.0}
    batch = make_batch(4)
    got = actor.compute_log_prob(batch)["old_log_probs"]
    merged = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():  # the expected model, merged here by hand
        for name, module in merged.named_modules():
            key = f"base_model.model.{name}.lora_A.weight"
            if key in tensors:
                module.weight += 3.0 * tensors[key.replace("lora_A", "lora_B")] @ tensors[key]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(got[mask], log_probs_of(merged, batch)[mask], atol=1e-5, rtol=1e-5)
    base = log_probs_of(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32), batch)
    assert (got[mask] - base[mask]).abs().max() > 1e-3  # the adapter changed the model
    reference = actor.reference_view().compute_ref_log_prob(batch)["ref_log_prob"]
    torch.testing.assert_close(reference[mask], base[mask], atol=1e-5, rtol=1e-5)  # the reference is the base


def test_an_adapter_that_does_not_fit_is_named(backend, platform, tiny_model_path, tmp_path):
    _peft_adapter(tmp_path / "adapter", tiny_model_path)
    config = evolve(job(tiny_model_path), model={"lora_adapter_path": str(tmp_path / "adapter"), "lora_rank": 8})
    with pytest.raises(RlcoreError, match="the adapter has rank 2, model.lora_rank is 8"):
        build_actor(backend, config, platform)
    config = evolve(job(tiny_model_path), model={"lora_adapter_path": str(tmp_path / "nowhere")})
    with pytest.raises(RlcoreError, match="is not a PEFT LoRA adapter config"):
        build_actor(backend, config, platform)


def test_a_lora_checkpoint_exports_its_adapter_as_peft_loads_it(backend, platform, tiny_model_path, tmp_path):
    """``rlcore export --adapter``: a PEFT adapter folder that ``peft.PeftModel.from_pretrained`` puts on
    the base model, computing the trained actor's log-probs (fp32, 1e-5); only the adapted layers are
    adapted (the excluded ones named in ``exclude_modules``)."""
    peft = pytest.importorskip("peft", reason="peft is part of the test extra")
    from transformers import AutoModelForCausalLM

    actor, batch = trained(backend, platform, tiny_model_path, steps=2, targets=("q_proj", "v_proj"))
    actor.save(str(tmp_path / "global_step_2" / "actor"))
    expected = actor.compute_log_prob(batch)["old_log_probs"]
    assert main(["export", str(tmp_path / "global_step_2"), "--to", str(tmp_path / "adapter"), "--adapter"]) == 0
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["adapter_config.json",
                                                                       "adapter_model.safetensors"]
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert written["r"] == 4 and written["lora_alpha"] == 8.0 and written["target_modules"] == ["q_proj", "v_proj"]
    assert written["base_model_name_or_path"] == str(tiny_model_path)
    mask = batch["response_mask"].bool()
    # the exported folder, and the one each LoRA checkpoint carries (verl's lora_adapter/), alike
    for folder in (tmp_path / "adapter", tmp_path / "global_step_2" / "actor" / "lora_adapter"):
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        model = peft.PeftModel.from_pretrained(base, str(folder)).eval()
        adapted = sorted(name for name, module in model.named_modules()
                         if isinstance(getattr(module, "lora_A", None), nn.ModuleDict))
        assert adapted and all(name.endswith(("q_proj", "v_proj")) for name in adapted)
        torch.testing.assert_close(log_probs_of(model, batch)[mask], expected[mask], atol=1e-5, rtol=1e-5)
    plain = log_probs_of(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32), batch)
    assert (plain[mask] - expected[mask]).abs().max() > 1e-4  # the adapter moved the model


def test_an_excluded_layer_is_named_in_the_peft_config_so_peft_leaves_it_as_rlcore_did(backend, platform,
                                                                                      tiny_model_path, tmp_path):
    peft = pytest.importorskip("peft", reason="peft is part of the test extra")
    from transformers import AutoModelForCausalLM

    config = evolve(lora_job(tiny_model_path, targets=("q_proj",)), model={"lora_exclude_modules": r".*\.0\..*"})
    actor = build_actor(backend, config, platform)
    batch = make_batch(4)
    for _ in range(2):
        actor.update(batch.update(actor.compute_log_prob(batch)).update(
            Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)})))
    actor.save(str(tmp_path / "step" / "actor"))
    expected = actor.compute_log_prob(batch)["old_log_probs"]
    assert main(["export", str(tmp_path / "step" / "actor"), "--to", str(tmp_path / "adapter"), "--adapter"]) == 0
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert written["exclude_modules"] == ["model.layers.0.self_attn.q_proj"]
    model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32),
                                           str(tmp_path / "adapter")).eval()
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(log_probs_of(model, batch)[mask], expected[mask], atol=1e-5, rtol=1e-5)
    # and rlcore starts from it again (model.lora_adapter_path), the excluded layer left out as before
    again = build_actor(backend, evolve(job(tiny_model_path), model={"lora_adapter_path": str(tmp_path / "adapter")}),
                        platform)
    torch.testing.assert_close(again.compute_log_prob(batch)["old_log_probs"][mask], expected[mask], atol=1e-5,
                               rtol=1e-5)


def test_adapter_export_of_a_checkpoint_without_adapters_is_refused_by_name(backend, platform, tiny_model_path,
                                                                            tmp_path, capsys):
    actor = build_actor(backend, job(tiny_model_path), platform)
    actor.save(str(tmp_path / "step" / "actor"))
    assert main(["export", str(tmp_path / "step" / "actor"), "--to", str(tmp_path / "adapter"), "--adapter"]) != 0
    assert "holds no LoRA adapters (its job had model.lora_rank = 0): export it without --adapter" in \
        capsys.readouterr().err
    assert not (tmp_path / "adapter").exists()


def test_the_adapter_for_the_engine_is_gathered_in_one_collective_as_the_per_parameter_gather_gives_it(
        tiny_model_path):
    """``AdapterGather`` (one flat all-gather a sync) against ``gathered_peft_adapter`` (one
    ``full_tensor`` per parameter) over 3 ranks: uneven shards, one of them empty, fp32 and bf16; the
    ranks check it (tests/fsdp/adapter_gather_ranks.py)."""
    from tests.ranks import run_ranks

    run_ranks("tests.fsdp.adapter_gather_ranks", str(tiny_model_path), world=3)


def test_the_actor_hands_the_engine_its_adapter_as_peft_names_it_each_sync_fresh(backend, platform,
                                                                                   tiny_model_path):
    """One rank: ``adapter_for_rollout`` equals ``gathered_peft_adapter``, and a later sync sees the
    adapter's new values (the parameters found once are the ones training updates)."""
    from rlcore_fsdp.sharding import gathered_peft_adapter

    config = job(tiny_model_path)
    actor = build_actor(backend, attrs.evolve(config, model=attrs.evolve(config.model, lora_rank=4)), platform)
    for step in range(2):
        with torch.no_grad():
            for name, param in actor.module.named_parameters():
                if name.endswith((".lora_A", ".lora_B")):
                    param.to_local().normal_()
        config, tensors = actor.adapter_for_rollout()
        expected_config, expected = gathered_peft_adapter(actor.module, actor.lora, actor.spec.path,
                                                          dtype=actor.compute_dtype, device=actor.device)
        assert config == expected_config and list(tensors) == list(expected)
        for name, tensor in expected.items():
            torch.testing.assert_close(tensors[name], tensor, rtol=0, atol=0)
