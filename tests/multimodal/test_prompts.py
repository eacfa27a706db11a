"""The tiny Qwen2-VL-shaped model's folder, and prompts with images turned into token ids and image inputs."""

from __future__ import annotations

import json

import attrs
import pytest
import torch

from rlcore.data.vision import MULTI_MODAL_INPUTS, fit_prompt
from rlcore.errors import RlcoreError
from tests.multimodal.helpers import prompt_dataset, vlm_job


def test_the_tiny_model_folder_is_a_qwen2_vl_with_an_image_processor_and_vision_tokens(tiny_vlm_path):
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_vlm_path)
    assert config.model_type == "qwen2_vl" and config.vision_config.depth == 2
    assert config.text_config.hidden_size == 64 and config.text_config.num_hidden_layers == 2
    processor = AutoImageProcessor.from_pretrained(tiny_vlm_path)
    assert type(processor).__name__ == "Qwen2VLImageProcessorPil"  # no torchvision needed
    assert json.loads((tiny_vlm_path / "preprocessor_config.json").read_text())["size"]["longest_edge"] == 56 * 56
    tokenizer = AutoTokenizer.from_pretrained(tiny_vlm_path)
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == config.image_token_id
    assert tokenizer.convert_tokens_to_ids("<|vision_start|>") == config.vision_start_token_id
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}],
        add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_prompt_with_an_image_carries_its_image_tokens_pixels_and_grid(tiny_vlm_path, shapes_data):
    dataset = prompt_dataset(tiny_vlm_path, shapes_data["train"])
    image_id = dataset.vision.image_token_id
    start, end = (dataset.vision.tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>"))
    for ids, row in zip(dataset.input_ids, dataset.rows):
        inputs = row[MULTI_MODAL_INPUTS]
        assert inputs["image_grid_thw"].tolist() == [[1, 4, 4]]  # 56 x 56 pixels: 4 x 4 patches of 14
        assert inputs["pixel_values"].shape == (16, 3 * 2 * 14 * 14)
        ids = ids.tolist()
        first = ids.index(start)
        assert ids[first + 1:first + 5] == [image_id] * 4 and ids[first + 5] == end  # 16 patches merged 2 x 2
        assert ids.count(image_id) == 4
    batch = dataset.batches(3).__next__()
    assert len(batch[MULTI_MODAL_INPUTS]) == 3 and len(batch["images"]) == 3


def test_truncation_never_cuts_an_image_and_refuses_images_longer_than_the_limit(tiny_vlm_path, shapes_data):
    image = 7
    ids = [1, 2, image, image, 3, 4, 5]
    assert fit_prompt(ids, 4, image, "left", "row 0") == [image, image, 4, 5]
    assert fit_prompt(ids, 4, image, "right", "row 0") == [1, 2, image, image]
    assert fit_prompt(ids, 2, image, "left", "row 0") == [image, image]
    with pytest.raises(RlcoreError, match="row 0: the prompt's images are 2 tokens, more than "
                                          "data.max_prompt_length = 1"):
        fit_prompt(ids, 1, image, "left", "row 0")

    full = prompt_dataset(tiny_vlm_path, shapes_data["train"])
    shortest = min(len(ids) for ids in full.input_ids)
    config = vlm_job(tiny_vlm_path, max_prompt_length=shortest - 3)
    for side in ("left", "right"):
        cut = prompt_dataset(tiny_vlm_path, shapes_data["train"],
                             attrs.evolve(config, data=attrs.evolve(config.data, truncation=side)))
        assert all(len(ids) == shortest - 3 for ids in cut.input_ids)
        assert all((ids == full.vision.image_token_id).sum() == 4 for ids in cut.input_ids)
    tiny = vlm_job(tiny_vlm_path, max_prompt_length=3)
    with pytest.raises(RlcoreError, match=r"train.parquet, row 0: the prompt's images are 4 tokens, more than "
                                          r"data.max_prompt_length = 3; truncation never cuts an image"):
        prompt_dataset(tiny_vlm_path, shapes_data["train"], attrs.evolve(tiny, data=attrs.evolve(tiny.data,
                                                                                              truncation="left")))
    with pytest.raises(RlcoreError, match="row 0: the prompt is .* tokens, longer than data.max_prompt_length = 3"):
        prompt_dataset(tiny_vlm_path, shapes_data["train"], tiny)  # truncation = "error", verl's default


def test_a_forward_of_the_tiny_model_is_fast(tiny_vlm_path, shapes_data):
    import time

    from tests.multimodal.helpers import plain_log_probs, rows_of

    batch = rows_of(prompt_dataset(tiny_vlm_path, shapes_data["train"]), range(4))
    started = time.perf_counter()
    log_probs = plain_log_probs(tiny_vlm_path, batch)
    assert torch.isfinite(log_probs).all()
    assert time.perf_counter() - started < 20


def test_mixed_rows_train_on_one_worker_and_are_refused_on_two(tiny_vlm_path, tmp_path):
    """A text-only row beside image rows: fine on one worker (its prompt is text); on two, a worker whose
    micro-batch has no image would skip the vision tower its peer gathers, so the job is refused first."""
    from rlcore.config import load_job
    from rlcore.trainer import Trainer
    from tests.data.test_images import png, row, write
    from tests.e2e.conftest import job_overrides

    data = tmp_path / "mixed"
    data.mkdir()
    rows = [row("<image>How many?", [{"bytes": png("red", 56), "path": None}], 0), row("What is 2 + 2?", [], 1)]
    write(data / "train.parquet", rows)
    write(data / "test.parquet", rows)
    settings = {"data.max_prompt_length": 128, "data.train_batch_size": 2}
    grpo = ["algorithm.adv_estimator=grpo", "rollout.n=2"]
    one = load_job(None, [*job_overrides(tiny_vlm_path, data, tmp_path / "one", **settings), "trainer.ray=false",
                          *grpo])
    trainer = Trainer(one, echo=lambda *_: None)
    assert trainer.train_data.has_images and trainer.train_data.rows[1].get(MULTI_MODAL_INPUTS) is None
    two = load_job(None, [*job_overrides(tiny_vlm_path, data, tmp_path / "two", **settings,
                                         **{"trainer.n_gpus_per_node": 2}), *grpo])
    with pytest.raises(RlcoreError, match="rows without images beside rows with them on more than one worker"):
        Trainer(two, echo=lambda *_: None)


def test_one_token_per_image_narrows_each_images_run_and_keeps_the_text():
    from rlcore.data.vision import one_token_per_image

    pad, start, end = 9, 7, 8
    ids = [1, start, pad, pad, pad, pad, end, 5, start, pad, pad, end, 6]
    assert one_token_per_image(ids, pad) == [1, start, pad, end, 5, start, pad, end, 6]
    assert one_token_per_image([pad, pad, 3], pad) == [pad, 3]
    assert one_token_per_image([1, 2, 3], pad) == [1, 2, 3]
