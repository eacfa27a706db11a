"""``rlcore data geo3k --input DIR``: Geometry3K's published parquet (columns images, problem, answer) to
the rows verl's ``examples/data_preprocess/geo3k.py`` writes, on a small copy built here with Pillow."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rlcore.cli import main
from rlcore.config.schema import DataConfig
from rlcore.data import geo3k
from rlcore.data.dataset import PromptDataset
from rlcore.data.images import image_column_type
from rlcore.errors import RlcoreError
from rlcore.testing import build_tiny_tokenizer

# verl's instruction, as its geo3k.py spells it
VERL_INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and then provide the final "
                    "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer "
                    "MUST BE put in \\boxed{}.")


def png(shade: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (12, 10), (shade, 255 - shade, 0)).save(buffer, format="PNG")
    return buffer.getvalue()


def records(split: str, count: int) -> list[dict]:
    return [{"images": [{"bytes": png(10 * i), "path": f"{split}_{i}.png"}],
             "problem": f"<image>Find x in {split} figure {i}.", "answer": ["3", "2\\sqrt{221}", "\\frac{40}{3}"][i % 3]}
            for i in range(count)]


def hub_folder(root, counts=(("train", 4), ("validation", 2), ("test", 3))):
    """Geometry3K as the hub publishes it: data/<split>-00000-of-00001.parquet."""
    (root / "data").mkdir(parents=True)
    for split, count in counts:
        table = pa.Table.from_pylist(records(split, count))
        table = table.set_column(0, "images", table.column("images").cast(image_column_type()))
        pq.write_table(table, root / "data" / f"{split}-00000-of-00001.parquet")
    return root


def test_rows_are_verls_and_images_are_kept(tmp_path):
    paths = geo3k.preprocess(hub_folder(tmp_path / "in"), tmp_path / "out")
    assert sorted(paths) == ["test", "train"]  # verl's script writes these two
    for split, count in (("train", 4), ("test", 3)):
        rows = pq.read_table(paths[split]).to_pylist()
        assert rows == [{
            "data_source": "hiyouga/geometry3k",
            "prompt": [{"role": "user", "content": f"{record['problem']} {VERL_INSTRUCTION}"}],
            "images": record["images"],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": record["answer"]},
            "extra_info": {"split": split, "index": i, "answer": record["answer"], "question": record["problem"]},
        } for i, record in enumerate(records(split, count))]
    dataset = PromptDataset(paths["train"], build_tiny_tokenizer(), DataConfig(max_prompt_length=4096), "train")
    assert dataset[1]["images"] == [png(10)] and dataset[1]["ground_truth"] == "2\\sqrt{221}"


def test_validation_split_and_plain_file_names(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for split, count in (("train", 2), ("validation", 1)):
        pq.write_table(pa.Table.from_pylist(records(split, count)), folder / f"{split}.parquet")
    paths = geo3k.preprocess(folder, tmp_path / "out", ("validation",))
    assert list(paths) == ["validation"] and pq.read_metadata(paths["validation"]).num_rows == 1
    with pytest.raises(RlcoreError, match=r"--input .*in: no test\.parquet \(nor data/test-\*\.parquet as on the hub\)"):
        geo3k.preprocess(folder, tmp_path / "out2")


def test_a_bad_image_is_named_by_file_and_row_and_nothing_is_written(tmp_path):
    folder = hub_folder(tmp_path / "in")
    bad = records("test", 3)
    bad[2]["images"][0]["bytes"] = b"not an image"
    pq.write_table(pa.Table.from_pylist(bad), folder / "data" / "test-00000-of-00001.parquet")
    with pytest.raises(RlcoreError, match=r"test-00000-of-00001\.parquet, row 2: image 0 of column 'images' cannot be "
                                          r"decoded as an image \(12 bytes\)"):
        geo3k.preprocess(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_end_to_end(tmp_path, capsys):
    assert main(["data", "geo3k", "--input", str(hub_folder(tmp_path / "in")), "--local-save-dir",
                 str(tmp_path / "out"), "--split", "train", "--split", "validation"]) == 0
    out = capsys.readouterr().out
    assert "wrote 4 train rows" in out and "wrote 2 validation rows" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train.parquet", "validation.parquet"]
