"""The sglang engine against transformers on a tiny model, wherever SGLang imports (a GPU machine
with SGLang 0.5.12-0.5.17). NOT yet run: SGLang cannot run on the machines rlcore is developed on."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch

from rlcore.batch import Batch
from rlcore.config.schema import DataConfig, RolloutConfig
from rlcore.models import load_tokenizer
from rlcore.plugins import get_manager
from rlcore.roles import SamplingParams
from rlcore.testing import build_actor
from rlcore_sglang.options import SglangOptions
from tests.engine_models import build_engine_model
from tests.fsdp.helpers import full_weights, job
from tests.sglang.conftest import SGLANG_MISSING

pytest.importorskip("sglang", reason=SGLANG_MISSING)
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the GPU machine)", allow_module_level=True)

QUESTIONS = ["What is 3 + 4?", "how many apples did she buy each week", "2 * 5 ="]
LENGTH = 16
GREEDY = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=LENGTH)


@pytest.fixture(scope="module")
def engine_model(tmp_path_factory) -> Path:
    return build_engine_model(tmp_path_factory.mktemp("sglang-models") / "tiny-qwen2")


@pytest.fixture(scope="module")
def actor(backend, platform, engine_model):
    # fp32 against transformers: torch_native attention (SGLang's default kernels have no fp32), a
    # tenth of the GPU (the pytest process holds other engines' memory until each shuts down)
    config = attrs.evolve(job(engine_model, lr=0.05), data=DataConfig(max_prompt_length=32, max_response_length=LENGTH),
                          rollout=RolloutConfig(name="sglang", gpu_memory_utilization=0.1),
                          sections={"rollout.sglang": SglangOptions(disable_cuda_graph=True,
                                                                    attention_backend="torch_native")})
    return config, build_actor(backend, config, platform)


@pytest.fixture(scope="module")
def engine(platform, actor):
    config, policy = actor
    engine = get_manager().get("rollout_engines", "sglang")(config, platform, policy)
    yield engine
    engine.engine.shutdown()  # gives the GPU memory back (SGLang's scheduler is a subprocess)


@pytest.fixture(scope="module")
def prompts(engine_model) -> Batch:
    encoded = load_tokenizer(str(engine_model))(QUESTIONS, return_tensors="pt", padding=True)
    return Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


def transformers_greedy(engine_model, prompts: Batch, weights=None) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(str(engine_model))
    model = AutoModelForCausalLM.from_pretrained(engine_model, dtype=torch.float32).eval()
    if weights is not None:
        model.load_state_dict(weights, strict=False)
    output = model.generate(input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"], do_sample=False,
                            max_new_tokens=LENGTH, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id)
    return output[:, prompts["input_ids"].shape[1]:]


def assert_greedy_matches(out: Batch, expected: torch.Tensor, pad_id: int) -> None:
    width = expected.shape[1]
    assert torch.equal(out["responses"][:, :width], expected)
    assert torch.all(out["responses"][:, width:] == pad_id)


def test_greedy_tokens_equal_transformers_and_survive_a_release(engine, engine_model, prompts):
    pad = load_tokenizer(str(engine_model)).pad_token_id
    expected = transformers_greedy(engine_model, prompts)
    out = engine.generate(prompts, GREEDY)
    assert_greedy_matches(out, expected, pad)
    assert out["rollout_log_probs"].shape == out["responses"].shape
    engine.release_memory()
    engine.resume_memory()
    assert_greedy_matches(engine.generate(prompts, GREEDY), expected, pad)


def test_after_an_actor_update_and_a_sync_greedy_output_is_the_updated_models(engine, actor, engine_model, prompts):
    _, policy = actor
    pad = load_tokenizer(str(engine_model)).pad_token_id
    batch = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=LENGTH, seed=1))
    advantages = torch.tensor([1.0, -1.0] * len(QUESTIONS)).unsqueeze(-1).expand(-1, LENGTH).contiguous()
    for _ in range(3):
        policy.update(batch.update(policy.compute_log_prob(batch)).update(Batch({"advantages": advantages})))
    engine.release_memory()
    engine.update_weights(policy.weights_for_rollout(2**20))
    engine.resume_memory()
    assert_greedy_matches(engine.generate(prompts, GREEDY), transformers_greedy(engine_model, prompts,
                                                                                full_weights(policy)), pad)
