"""``rlcore data geo3k --input DIR``: Geometry3K (``hiyouga/geometry3k``) as verl's multimodal parquet.

Reads the dataset's published parquet files that the user already has (columns ``images``, a list of
``{bytes, path}``, ``problem``, whose text holds an ``<image>`` per image, and ``answer``) and writes
what verl's ``examples/data_preprocess/geo3k.py`` writes: the problem and verl's instruction as one
user message, the images as they are (a path read into bytes), data_source "hiyouga/geometry3k"
(scored by ``rlcore.rewards.geo3k``), the answer as ``reward_model.ground_truth`` and
``extra_info`` {split, index, answer, question}. Every image is decoded and matched to its
placeholder first: a bad row is named by file and row, and nothing is written.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rlcore.cli import Command
from rlcore.data.files import read_records, write_parquet_atomic
from rlcore.data.images import image_column_type, row_images
from rlcore.errors import RlcoreError
from rlcore.rewards.geo3k import DATA_SOURCE

INSTRUCTION = (r"You FIRST think about the reasoning process as an internal monologue and then provide the final "
               r"answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer "
               r"MUST BE put in \boxed{}.")
SPLITS = ("train", "validation", "test")
DEFAULT_SPLITS = ("train", "test")  # what verl's script writes
COLUMNS = ("images", "problem", "answer")


def split_files(folder: Path, split: str) -> list[Path]:
    """The parquet files of ``split`` in ``folder``: ``split.parquet``, or the hub's ``data/split-*.parquet``
    shards (in name order)."""
    for pattern in (f"{split}.parquet", f"data/{split}-*.parquet", f"{split}-*.parquet"):
        found = sorted(folder.glob(pattern))
        if found:
            return found
    raise RlcoreError(f"--input {folder}: no {split}.parquet (nor data/{split}-*.parquet as on the hub) in that "
                      "folder; it should hold Geometry3K's parquet files (columns images, problem, answer)")


def to_row(record: dict, split: str, index: int, where: str, folder: Path) -> dict:
    """One verl-schema row of a Geometry3K record; ``where`` names the file and row in errors."""
    for field in ("problem", "answer"):
        if not isinstance(record[field], str):
            raise RlcoreError(f"{where}: {field!r} is {type(record[field]).__name__}, expected text")
    prompt = [{"role": "user", "content": f"{record['problem']} {INSTRUCTION}"}]
    images = row_images(record["images"], prompt, folder, where, "images")
    paths = [entry.get("path") if isinstance(entry, dict) else entry for entry in record["images"]]
    return {
        "data_source": DATA_SOURCE,
        "prompt": prompt,
        "images": [{"bytes": data, "path": path} for data, path in zip(images, paths)],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": record["answer"]},
        "extra_info": {"split": split, "index": index, "answer": record["answer"], "question": record["problem"]},
    }


def read_split(folder: Path, split: str) -> list[dict]:
    rows = []
    for path in split_files(folder, split):
        for where, record in read_records(path, COLUMNS):
            rows.append(to_row(record, split, len(rows), where, path.parent))
    return rows


def preprocess(input_dir: str | os.PathLike, local_save_dir: str | os.PathLike,
               splits: tuple[str, ...] = DEFAULT_SPLITS) -> dict[str, Path]:
    """Write ``<split>.parquet`` for each of ``splits`` into ``local_save_dir``; returns the paths by split."""
    folder = Path(input_dir).expanduser()
    if not folder.is_dir():
        raise RlcoreError(f"--input {folder} is not a folder: pass the folder holding Geometry3K's parquet files")
    unknown = [s for s in splits if s not in SPLITS]
    if unknown or not splits:
        raise RlcoreError(f"--split takes {', '.join(SPLITS)}, got {', '.join(splits) or 'nothing'}")
    # Read and check every split before writing anything, so bad input leaves no partial output.
    rows = {split: read_split(folder, split) for split in splits}
    out = Path(local_save_dir).expanduser()
    return {split: write_parquet_atomic(split_rows, out / f"{split}.parquet", {"images": image_column_type()})
            for split, split_rows in rows.items()}


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, metavar="DIR",
                        help="folder of Geometry3K's parquet files (train.parquet, ... or the hub's "
                             "data/train-*.parquet), columns images, problem, answer")
    parser.add_argument("--local-save-dir", "--local_save_dir", default="~/data/geo3k", metavar="DIR",
                        help="folder to write train.parquet and test.parquet into (default: ~/data/geo3k)")
    parser.add_argument("--split", action="append", choices=SPLITS, default=None,
                        help="write this split (repeatable; default: train and test, as verl's script)")


def _run(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    for split, path in preprocess(args.input, args.local_save_dir, tuple(args.split or DEFAULT_SPLITS)).items():
        print(f"wrote {pq.read_metadata(path).num_rows} {split} rows to {path}")
    return 0


COMMAND = Command(help="Geometry3K (hiyouga/geometry3k) files you have, as verl's multimodal parquet",
                  configure=_configure, run=_run)
