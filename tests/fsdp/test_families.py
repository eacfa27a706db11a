"""Model families through the fsdp backend, one rank on the CPU, fp32 (issue 38: families verified one by one).

Each family is a tiny model built from its real transformers config class (hidden 64, 2 layers, the
project's 512-token tokenizer, random weights) with the features that make the family what it is
switched on and made to matter at 14 tokens: Llama's llama3 rope scaling, Gemma 2's attention and
final-logit soft-capping, sliding window (4) and embedding scale, Mistral's sliding window (4),
DeepSeek-V3's multi-head latent attention (query and key/value low-rank, separate rope / no-rope
query-key dims, a value head dim of its own) and its routed + shared experts, Qwen3's q/k norms,
Qwen3-MoE's experts. Per family:

(a) padded log-probs (``model.use_remove_padding=false``) equal a plain transformers forward of the
    model loaded directly, in eager attention (the implementation that does every family's attention
    by the book, soft-capping included);
(b) packed rows (``model.use_remove_padding=true``) give the same log-probs;
(c) one actor update gives a finite loss and grad norm and changes the weights;
(d) the updated actor's weights, saved and exported as a Hugging Face folder, load back in
    transformers and give the updated actor's log-probs.

Run: ``python -m pytest -q tests/fsdp/test_families.py`` (the table in docs/models.md).
"""

from __future__ import annotations

import math

import attrs
import pytest
import torch

from rlcore.batch import Batch
from rlcore.testing import build_actor
from rlcore_fsdp.export import export_checkpoint
from tests.families import FAMILIES, build_family_model
from tests.fsdp.helpers import RESPONSE_LENGTH, full_weights, job, make_batch

ATOL = 1e-4  # fp32, several kernels (SDPA vs eager, per-sample vs padded) summing in different orders


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each family's model folder, built on first use and shared by the module's tests."""
    built: dict[str, object] = {}
    root = tmp_path_factory.mktemp("families")

    def folder(family: str):
        if family not in built:
            built[family] = build_family_model(family, root / family)
        return built[family]

    return folder


def reference_log_probs(model_path, batch: Batch, **config) -> torch.Tensor:
    """Response-token log-probs from a plain transformers forward, eager attention, full logits
    (``config``: settings replaced in the model's config first)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(model_path)
    for name, value in config.items():
        setattr(hf_config, name, value)
    model = AutoModelForCausalLM.from_pretrained(model_path, config=hf_config, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(**{key: batch[key] for key in ("input_ids", "attention_mask", "position_ids")}).logits
    log_probs = torch.log_softmax(logits[:, -RESPONSE_LENGTH - 1:-1].float(), dim=-1)
    return log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def packed(config):
    return attrs.evolve(config, model=attrs.evolve(config.model, use_remove_padding=True))


@pytest.fixture(scope="module")
def batch():
    return make_batch(5)


# what each family's own features are, switched off: each must change the reference log-probs, so that
# the checks below test them (a random tiny model could make a soft-cap or a window a no-op)
FEATURES_OFF = [
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    ("gemma2", {"attn_logit_softcapping": None}),
    ("gemma2", {"final_logit_softcapping": None}),
    ("gemma2", {"sliding_window": 64}),
    ("mistral", {"sliding_window": None}),
]


@pytest.mark.parametrize("family, off", FEATURES_OFF, ids=[f"{f}-{next(iter(o))}" for f, o in FEATURES_OFF])
def test_each_family_feature_changes_the_reference(folders, batch, family, off):
    path = folders(family)
    mask = batch["response_mask"].bool()
    difference = (reference_log_probs(path, batch)[mask] - reference_log_probs(path, batch, **off)[mask]).abs().max()
    assert difference > 100 * ATOL


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_log_probs_equal_a_plain_transformers_forward(backend, platform, folders, batch, family):
    path = folders(family)
    out = build_actor(backend, job(path), platform).compute_log_prob(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(out[mask], reference_log_probs(path, batch)[mask], atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_log_probs_equal_a_plain_transformers_forward(backend, platform, folders, batch, family):
    path = folders(family)
    out = build_actor(backend, packed(job(path)), platform).compute_log_prob(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(out[mask], reference_log_probs(path, batch)[mask], atol=ATOL, rtol=1e-4)
    assert torch.all(out[~mask] == 0)


@pytest.fixture(scope="module")
def updated(backend, platform, folders, batch):
    """Each family's actor after one update step (packed rows), with its metrics and first weights."""
    done: dict[str, tuple] = {}

    def get(family: str):
        if family not in done:
            actor = build_actor(backend, packed(job(folders(family), lr=1e-2)), platform)
            before = full_weights(actor)
            advantages = torch.linspace(-1.0, 1.0, len(batch) * RESPONSE_LENGTH).view(-1, RESPONSE_LENGTH)
            metrics = actor.update(batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": advantages})))
            done[family] = actor, metrics, before
        return done[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_one_update_is_finite_and_moves_the_weights(updated, family):
    actor, metrics, before = updated(family)
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert math.isfinite(metrics[key]), (key, metrics[key])
    assert metrics["actor/grad_norm"] > 0
    after = full_weights(actor)
    assert after.keys() == before.keys()
    moved = {name for name in before if not torch.equal(after[name], before[name])}
    assert moved, "no weight changed"
    # every trained matrix of the first layer and the embedding moved (experts a token never chose may not)
    assert any("embed_tokens" in name for name in moved)
    assert any(name.startswith("model.layers.0.") and "attn" in name for name in moved)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_exported_folder_loads_in_transformers_with_the_actors_log_probs(updated, batch, family, tmp_path):
    actor, _, _ = updated(family)
    actor.save(str(tmp_path / "step" / "actor"))
    out = export_checkpoint(str(tmp_path / "step" / "actor"), str(tmp_path / "hf"))
    expected = actor.compute_log_prob(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(reference_log_probs(out, batch)[mask], expected[mask], atol=ATOL, rtol=1e-4)
