"""``rlcore data shapes``: seeded, verl's multimodal schema, and answers that match what the images show
(read back from the pixels here, not from the generator's own list of shapes)."""

from __future__ import annotations

import io
from collections import Counter

import pyarrow.parquet as pq
import pytest
from PIL import Image

from rlcore.cli import main
from rlcore.config.schema import DataConfig
from rlcore.data.dataset import PromptDataset
from rlcore.data.shapes import ShapesTask, generate, write
from rlcore.errors import RlcoreError
from rlcore.rewards.shapes import compute_score
from rlcore.testing import build_tiny_tokenizer

TASK = ShapesTask(image_size=96)


def blobs(image: Image.Image) -> list[tuple[str, tuple[int, int, int]]]:
    """(kind, colour) of each connected patch of non-white pixels; the kind told by how much of its
    bounding box it fills (square 1, circle pi/4, triangle 1/2)."""
    width, height = image.size
    pixels = image.load()
    seen, found = set(), []
    for start in ((x, y) for y in range(height) for x in range(width)):
        if start in seen or pixels[start] == (255, 255, 255):
            continue
        seen.add(start)
        stack, patch = [start], []
        while stack:
            x, y = stack.pop()
            patch.append((x, y))
            for near in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if 0 <= near[0] < width and 0 <= near[1] < height and near not in seen \
                        and pixels[near] != (255, 255, 255):
                    seen.add(near)
                    stack.append(near)
        xs, ys = [p[0] for p in patch], [p[1] for p in patch]
        fill = len(patch) / ((max(xs) - min(xs) + 1) * (max(ys) - min(ys) + 1))
        kind = "square" if fill > 0.92 else "circle" if fill > 0.68 else "triangle"
        found.append((kind, Counter(pixels[p] for p in patch).most_common(1)[0][0]))
    return found


def test_the_same_seed_gives_the_same_rows_and_splits_differ():
    first, again = generate(TASK, "train", 6, seed=3), generate(TASK, "train", 6, seed=3)
    assert first == again
    assert generate(TASK, "test", 6, seed=3) != first and generate(TASK, "train", 6, seed=4) != first


def test_answers_match_the_pictures():
    rows = generate(TASK, "train", 40, seed=0)
    assert {row["extra_info"]["kind"] for row in rows} == {"count", "count_all", "most"}
    for row in rows:
        (entry,) = row["images"]
        shown = blobs(Image.open(io.BytesIO(entry["bytes"])).convert("RGB"))
        kinds = Counter(kind for kind, _ in shown)
        question, answer = row["extra_info"]["question"], row["reward_model"]["ground_truth"]
        assert row["prompt"] == [{"role": "user", "content": f"<image>{question} Put the final answer in \\boxed{{}}."}]
        if question.startswith("How many shapes"):
            assert answer == str(len(shown)), question
        elif question.startswith("How many"):
            assert answer == str(kinds[question.split()[2].removesuffix("s")]), question
        else:
            top = kinds.most_common()
            assert answer == top[0][0] and (len(top) == 1 or top[1][1] < top[0][1]), (question, top)
        assert row["data_source"] == "rlcore/shapes" and compute_score("rlcore/shapes", f"\\boxed{{{answer}}}",
                                                                     answer, row["extra_info"])["score"] == 1.0


def test_the_written_files_load_as_prompts_with_their_images(tmp_path):
    paths = write(tmp_path, TASK, train_size=5, test_size=2, seed=0)
    assert pq.read_metadata(paths["test"]).num_rows == 2
    schema = pq.read_schema(paths["train"])
    assert str(schema.field("images").type) == "list<element: struct<bytes: binary, path: string>>"
    dataset = PromptDataset(paths["train"], build_tiny_tokenizer(), DataConfig(), "train")
    assert dataset.has_images and all(len(dataset[i]["images"]) == 1 for i in range(5))


def test_cli_writes_both_splits_and_checks_its_options(tmp_path, capsys):
    assert main(["data", "shapes", "--local-save-dir", str(tmp_path), "--train-size", "3", "--test-size", "2",
                 "--image-size", "48", "--questions", "count_all"]) == 0
    assert "wrote 3 train rows" in capsys.readouterr().out
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert {row["extra_info"]["kind"] for row in rows} == {"count_all"}
    assert Image.open(io.BytesIO(rows[0]["images"][0]["bytes"])).size == (48, 48)
    with pytest.raises(RlcoreError, match="--max-shapes must satisfy"):
        generate(ShapesTask(max_shapes=10), "train", 1, 0)
    with pytest.raises(RlcoreError, match="--questions takes some of count, count_all, most"):
        generate(ShapesTask(questions=("colour",)), "train", 1, 0)
