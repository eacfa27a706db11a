"""Images in verl's multimodal rows: read, checked and carried by ``PromptDataset``; each bad image named
by file and row when the data is loaded; a job with images stopped before any worker starts."""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rlcore.config import load_job
from rlcore.config.schema import DataConfig
from rlcore.data.dataset import PromptDataset, PromptLoader
from rlcore.data.images import decode, image_column_type, processor_messages
from rlcore.errors import RlcoreError
from rlcore.testing import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def png(colour: str, size: int = 8) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def noise_png(size: int = 32) -> bytes:
    """A PNG that compresses badly, so that cutting it in half cuts its pixel data."""
    buffer = io.BytesIO()
    Image.frombytes("RGB", (size, size), random.Random(0).randbytes(size * size * 3)).save(buffer, format="PNG")
    return buffer.getvalue()


def row(content: str, images: list | None, index: int = 0) -> dict:
    return {"data_source": "rlcore/shapes", "prompt": [{"role": "user", "content": content}], "images": images,
            "ability": "visual_reasoning", "reward_model": {"style": "rule", "ground_truth": str(index)},
            "extra_info": {"split": "train", "index": index}}


def write(path, rows, typed: bool = True):
    table = pa.Table.from_pylist(rows)
    if typed:
        table = table.set_column(table.schema.get_field_index("images"), "images",
                                 table.column("images").cast(image_column_type()))
    pq.write_table(table, path)
    return path


def test_images_are_read_checked_and_carried_in_placeholder_order(tmp_path, tokenizer):
    (tmp_path / "pictures").mkdir()
    (tmp_path / "pictures" / "blue.png").write_bytes(png("blue"))
    rows = [row("<image>How many?", [{"bytes": png("red"), "path": "red.png"}], 0),
            row("Compare <image> with <image>.", [{"bytes": png("green"), "path": None},
                                                  {"bytes": None, "path": "pictures/blue.png"}], 1),
            row("No picture here.", [], 2),
            row("Nor here.", None, 3)]
    dataset = PromptDataset(write(tmp_path / "train.parquet", rows), tokenizer, DataConfig(), "train")
    assert dataset.has_images
    assert [len(dataset[i]["images"]) for i in range(4)] == [1, 2, 0, 0]
    assert dataset[1]["images"] == [png("green"), png("blue")]  # a path is read, relative to the parquet file
    assert dataset[1]["raw_prompt"] == rows[1]["prompt"]  # the text keeps its placeholders
    batch = PromptLoader(dataset, 4, shuffle=False).next_batch()
    assert batch["images"] == [dataset[i]["images"] for i in range(4)]
    # what a processor's chat template takes, as verl's _build_messages builds it
    (message,) = processor_messages(dataset[1]["raw_prompt"], dataset[1]["images"])
    kinds = [(part["type"], part.get("text")) for part in message["content"]]
    assert kinds == [("text", "Compare "), ("image", None), ("text", " with "), ("image", None), ("text", ".")]
    assert message["content"][3]["image"].getpixel((0, 0)) == (0, 0, 255)


def test_text_only_data_carries_no_images_row(tmp_path, tokenizer):
    plain = [{k: v for k, v in row("What is 1 + 1?", None).items() if k != "images"}]
    dataset = PromptDataset(write(tmp_path / "a.parquet", plain, typed=False), tokenizer, DataConfig(), "train")
    assert not dataset.has_images and "images" not in PromptLoader(dataset, 1).next_batch().rows


def test_data_image_key_names_the_column(tmp_path, tokenizer):
    rows = [{("frames" if k == "images" else k): v for k, v in row("<image>Count.", [{"bytes": png("red")}]).items()}]
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert not PromptDataset(path, tokenizer, DataConfig(), "train").has_images  # "<image>" is text without it
    dataset = PromptDataset(path, tokenizer, DataConfig(image_key="frames"), "train")
    assert dataset[0]["images"] == [png("red")]


@pytest.mark.parametrize(("content", "images", "message"), [
    ("<image>Count.", [{"bytes": b"\x89PNG\r\n\x1a\n not really", "path": None}],
     r"row 1: image 0 of column 'images' cannot be decoded as an image \(19 bytes\): no image format Pillow reads"),
    ("<image>Count.", [{"bytes": noise_png()[:1000], "path": None}],  # truncated: the header reads, the pixels not
     r"row 1: image 0 of column 'images' cannot be decoded as an image \(1000 bytes\): OSError: image file is "
     r"truncated"),
    ("<image>Count.", [{"bytes": None, "path": "gone/missing.png"}],
     r"row 1: image 0 of column 'images': its path 'gone/missing.png' does not exist \(looked for .*gone/missing\.png\)"),
    ("<image>Count.", [{"bytes": None, "path": None}], r"row 1: image 0 of column 'images': has neither bytes nor a path"),
    ("<image> and <image>", [{"bytes": png("red"), "path": None}],
     r"row 1: the prompt has 2 <image> placeholder\(s\) but column 'images' holds 1 image\(s\)"),
    ("Count the shapes.", [{"bytes": png("red"), "path": None}],
     r"row 1: the prompt has 0 <image> placeholder\(s\) but column 'images' holds 1 image\(s\)"),
    ("<image>Count.", None, r"row 1: the prompt has 1 <image> placeholder\(s\) but column 'images' holds 0 image"),
])
def test_each_bad_image_is_named_by_file_and_row(tmp_path, tokenizer, content, images, message):
    rows = [row("<image>Fine.", [{"bytes": png("red"), "path": None}], 0), row(content, images, 1)]
    path = write(tmp_path / "bad.parquet", rows)
    with pytest.raises(RlcoreError, match=r"^val data file .*bad\.parquet, " + message):
        PromptDataset(path, tokenizer, DataConfig(), "val")


def test_rows_with_videos_are_still_refused_naming_the_row(tmp_path, tokenizer):
    video = [dict(row("Watch.", None, i), videos=["clip.mp4"] if i == 1 else None) for i in range(2)]
    with pytest.raises(RlcoreError, match=r"train data file .*video\.parquet, row 1: column 'videos' holds videos "
                                          r"\(1\); rlcore reads images \(data.image_key\) but not videos or audio"):
        PromptDataset(write(tmp_path / "video.parquet", video), tokenizer, DataConfig(), "train")


def test_decode_gives_rgb(tmp_path):
    buffer = io.BytesIO()
    Image.new("L", (4, 4), 128).save(buffer, format="PNG")
    assert decode(buffer.getvalue()).mode == "RGB"


def test_a_job_with_images_stops_before_training_naming_what_is_missing(tmp_path):
    """A job whose data carries images on a text model (or with an engine or backend that does not take
    them) is refused when its data is loaded, before any worker starts, rather than trained on the text
    alone; each missing piece is named."""
    from rlcore.data.shapes import ShapesTask, write as write_shapes
    from rlcore.testing import build_tiny_model
    from rlcore.trainer import Trainer
    from tests.e2e.conftest import job_overrides

    model = build_tiny_model(tmp_path / "model", num_layers=1)
    data = tmp_path / "shapes"
    write_shapes(data, ShapesTask(image_size=32), train_size=4, test_size=2, seed=0)
    job = load_job(None, [*job_overrides(model, data, tmp_path / "run"), "trainer.ray=false"])
    with pytest.raises(RlcoreError, match=r"the train data carries images \(.*train\.parquet, row 0: 1 in column "
                                          r"'images'\), but model.path .* is not a vision-language model \(its folder "
                                          r"has no preprocessor_config.json"):
        Trainer(job, echo=lambda *_: None)
    for override, named in (("algorithm.adv_estimator=gae", "the critic .* does not take images yet"),
                            ("trainer.backend=megatron", r"trainer.backend = 'megatron' does not forward images "
                                                         r"\(backends that do: fsdp")):
        job = load_job(None, [*job_overrides(model, data, tmp_path / "run"), "trainer.ray=false", override])
        with pytest.raises(RlcoreError, match=named):
            Trainer(job, echo=lambda *_: None)
