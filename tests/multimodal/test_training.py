"""The fsdp backend's actor and reference with images, and the hf engine generating with them, on the tiny
Qwen2-VL-shaped model: log-probs as a plain transformers forward gives them, 3-D rotary positions included."""

from __future__ import annotations

import pytest
import torch

from rlcore.batch import Batch
from rlcore.data.vision import MULTI_MODAL_INPUTS
from rlcore.errors import RlcoreError
from rlcore.training.roles import SamplingParams
from rlcore.testing import build_actor, build_reference, build_rollout
from tests.multimodal.helpers import RESPONSE_LENGTH, plain_log_probs, prompt_dataset, rows_of, vlm_job


@pytest.fixture(scope="module")
def platform():
    from rlcore.runtime.platforms import current_platform

    return current_platform()


@pytest.fixture(scope="module")
def backend():
    from rlcore.plugins.manager import get_manager

    return get_manager().get("training_backends", "fsdp")


@pytest.fixture(scope="module")
def dataset(tiny_vlm_path, shapes_data):
    return prompt_dataset(tiny_vlm_path, shapes_data["train"])


@pytest.fixture(scope="module")
def actor(backend, platform, tiny_vlm_path):
    return build_actor(backend, vlm_job(tiny_vlm_path), platform)


def swapped_images(batch: Batch, donor: Batch) -> Batch:
    """``batch`` with each row's image inputs taken from ``donor``'s rows (same token ids)."""
    return Batch(batch.tensors, batch.rows | {MULTI_MODAL_INPUTS: donor[MULTI_MODAL_INPUTS]})


def test_actor_log_probs_equal_a_plain_transformers_forward_with_the_images(actor, dataset, tiny_vlm_path):
    batch = rows_of(dataset, range(5))  # left-padded prompts, responses of 6, 5 and 4 tokens
    assert batch["attention_mask"][:, 0].min() == 0  # some rows are padded: the 3-D positions must skip the pads
    out = actor.compute_log_prob(batch)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(out["old_log_probs"][mask], plain_log_probs(tiny_vlm_path, batch)[mask],
                               atol=1e-5, rtol=1e-5)
    # each row alone (no padding) gives the same: positions depend on the row, not on its batch
    for row in (0, 3):
        alone = rows_of(dataset, [row])
        alone_out = actor.compute_log_prob(alone)["old_log_probs"][0]
        length = int(alone["response_mask"][0].sum())
        expected = plain_log_probs(tiny_vlm_path, alone)[0, :length]
        torch.testing.assert_close(alone_out[:length], expected, atol=1e-5, rtol=1e-5)


def test_a_different_image_changes_the_log_probs(actor, dataset):
    batch = rows_of(dataset, range(4))
    other = rows_of(dataset, [4, 5, 6, 7])
    mask = batch["response_mask"].bool()
    same = actor.compute_log_prob(batch)["old_log_probs"][mask]
    changed = actor.compute_log_prob(swapped_images(batch, other))["old_log_probs"][mask]
    assert (same - changed).abs().max() > 1e-4


def test_the_reference_forwards_the_images_as_the_initial_actor(backend, platform, tiny_vlm_path, dataset):
    reference = build_reference(backend, vlm_job(tiny_vlm_path), platform)
    batch = rows_of(dataset, range(4))
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(reference.compute_ref_log_prob(batch)["ref_log_prob"][mask],
                               plain_log_probs(tiny_vlm_path, batch)[mask], atol=1e-5, rtol=1e-5)


def test_packed_rows_with_images_give_the_padded_log_probs(backend, platform, tiny_vlm_path, dataset, actor):
    """model.use_remove_padding: the rows' real tokens back to back, each row's 3-D positions packed beside
    them, the vision tower attending within each image; the same log-probs and gradients as padded rows."""
    import attrs

    from tests.fsdp.helpers import full_weights

    config = vlm_job(tiny_vlm_path, rollout={"log_prob_micro_batch_size_per_gpu": 2})
    packed = build_actor(backend, attrs.evolve(config, model=attrs.evolve(config.model, use_remove_padding=True)),
                         platform)
    padded = build_actor(backend, config, platform)
    batch = rows_of(dataset, range(5))
    mask = batch["response_mask"].bool()
    packed_out, padded_out = packed.compute_log_prob(batch), padded.compute_log_prob(batch)
    torch.testing.assert_close(packed_out["old_log_probs"][mask], padded_out["old_log_probs"][mask],
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed_out["old_log_probs"][mask], plain_log_probs(tiny_vlm_path, batch)[mask],
                               atol=1e-5, rtol=1e-5)
    assert (packed_out["old_log_probs"][~mask] == 0).all()
    rows = batch.select(range(4))
    for role, out in ((packed, packed_out), (padded, padded_out)):
        role.update(rows.update(Batch({"old_log_probs": out["old_log_probs"][:4],
                                       "advantages": torch.ones(4, RESPONSE_LENGTH)})))
    after_packed, after_padded = full_weights(packed), full_weights(padded)
    for name, value in after_padded.items():
        torch.testing.assert_close(after_packed[name], value, atol=5e-5, rtol=0)


def test_token_budget_micro_batches_carry_each_rows_images(backend, platform, tiny_vlm_path, dataset):
    """use_dynamic_bsz: micro-batches formed by token budget (rows reordered) keep each row's own images."""
    import attrs

    config = vlm_job(tiny_vlm_path, actor={"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 160},
                     rollout={"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": 160})
    batch = rows_of(dataset, range(5))
    mask = batch["response_mask"].bool()
    expected = plain_log_probs(tiny_vlm_path, batch)[mask]
    for packed in (False, True):
        job = attrs.evolve(config, model=attrs.evolve(config.model, use_remove_padding=packed))
        out = build_actor(backend, job, platform).compute_log_prob(batch)
        torch.testing.assert_close(out["old_log_probs"][mask], expected, atol=1e-5, rtol=1e-5)


def test_updates_train_the_model_and_freeze_vision_tower_keeps_the_vision_tower(backend, platform, tiny_vlm_path,
                                                                                dataset):
    from tests.fsdp.helpers import full_weights

    batch = rows_of(dataset, range(4))
    for freeze in (False, True):
        actor = build_actor(backend, vlm_job(tiny_vlm_path, actor={"freeze_vision_tower": freeze}), platform)
        before = full_weights(actor)
        batch_with = batch.update(actor.compute_log_prob(batch)).update(
            Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)}))
        metrics = actor.update(batch_with)
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))
        after = full_weights(actor)
        moved = {name for name in before if not torch.equal(before[name], after[name])}
        vision = {name for name in before if ".visual." in name or name.startswith("model.visual")}
        assert vision and any(".language_model." in name for name in moved)
        if freeze:
            assert not moved & vision
        else:
            assert moved & vision  # the image encoder receives gradients through the image tokens


def test_freeze_vision_tower_on_a_text_model_is_refused(backend, platform, tmp_path):
    from rlcore.testing import build_tiny_model

    path = build_tiny_model(tmp_path / "text")
    with pytest.raises(RlcoreError, match="actor.freeze_vision_tower: the model .* has no vision tower"):
        build_actor(backend, vlm_job(path, actor={"freeze_vision_tower": True}), platform)


def test_the_hf_engine_generates_with_the_images(actor, platform, dataset):
    from rlcore.plugins.manager import get_manager

    from rlcore.data.dataset import collate

    rollout = build_rollout(get_manager().get("rollout_engines", "hf"), vlm_job(actor.spec.path), platform, actor)
    prompts = collate(dataset, [0, 1, 2], epoch=0)
    sampling = SamplingParams(n=2, max_new_tokens=RESPONSE_LENGTH, temperature=1.0, top_p=1.0, top_k=-1,
                              do_sample=True, seed=3)
    out = rollout.generate(prompts, sampling)
    assert len(out) == 6 and out["responses"].shape == (6, RESPONSE_LENGTH)
    # the engine's log-probs of what it sampled are the actor's, which sees the same images
    rows = Batch(out.tensors, prompts.repeat_interleave(2).rows)
    mask = out["response_mask"].bool()
    torch.testing.assert_close(actor.compute_log_prob(rows)["old_log_probs"][mask], out["rollout_log_probs"][mask],
                               atol=1e-4, rtol=1e-4)
    # another image, the same text: other log-probs for the same sampled tokens
    again = rollout.generate(swapped_images(prompts, collate(dataset, [3, 4, 5], epoch=0)), sampling)
    assert not torch.allclose(again["rollout_log_probs"], out["rollout_log_probs"], atol=1e-4)


def test_an_image_token_sampled_in_a_response_is_text_padded_and_packed(backend, platform, tiny_vlm_path, dataset):
    """A young policy may sample the image token: its rows must still train (seen on an H200 at step 2 of a
    Qwen2.5-VL-3B-shaped job: transformers took it for an image's and the 3-D positions broke), with the
    token embedded as text at a text position, as the engine embedded it."""
    import attrs
    from transformers import AutoConfig

    from tests.multimodal.helpers import log_probs_with_text_image_tokens

    batch = rows_of(dataset, range(4))
    image_token = AutoConfig.from_pretrained(tiny_vlm_path).image_token_id
    responses = batch["responses"].clone()
    responses[0, 1], responses[1, 0], responses[2, 1:3] = image_token, image_token, image_token
    width = batch["input_ids"].shape[1] - RESPONSE_LENGTH
    input_ids = torch.cat([batch["input_ids"][:, :width], responses], dim=1)
    batch = batch.update(Batch({"responses": responses, "input_ids": input_ids}))
    mask = batch["response_mask"].bool()
    assert (batch["responses"][mask] == image_token).sum() >= 4
    expected = log_probs_with_text_image_tokens(tiny_vlm_path, batch)[mask]
    config = vlm_job(tiny_vlm_path)
    for packed in (False, True):
        job = attrs.evolve(config, model=attrs.evolve(config.model, use_remove_padding=packed))
        out = build_actor(backend, job, platform).compute_log_prob(batch)["old_log_probs"][mask]
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
