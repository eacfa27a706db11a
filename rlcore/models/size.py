"""How many parameters a model folder holds, read from its safetensors headers (no weights loaded).

A safetensors file opens with an 8-byte little-endian length and a JSON header naming each tensor's
shape: the sum of the shapes' products is the model's size as it was saved (tied weights saved once).
A sharded folder lists its files in ``model.safetensors.index.json``. A folder without safetensors
(``pytorch_model.bin``), a hub id that is not a folder, or a file that is not safetensors gives None:
the caller decides without the size and says so.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

HEADER_LIMIT = 100 * 2**20  # a header longer than this is not a safetensors file's


def safetensors_parameters(file: Path) -> int | None:
    """The elements of every tensor in one safetensors file, or None where it is not one."""
    try:
        with open(file, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                return None
            (length,) = struct.unpack("<Q", prefix)
            if length > HEADER_LIMIT:
                return None
            header = json.loads(handle.read(length))
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    total = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        shape = tensor.get("shape") if isinstance(tensor, dict) else None
        if not isinstance(shape, list):
            return None
        total += math.prod(shape)
    return total


def weight_files(folder: Path) -> list[Path]:
    """The folder's model weights in safetensors: the index's shards, else ``model.safetensors``."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError):
            return []
        return [folder / shard for shard in shards]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else []


def parameter_count(path: str) -> int | None:
    """The parameters of the model folder ``path`` (a resolved ``model.path``), or None where its weights
    are not safetensors in a local folder."""
    folder = Path(path)
    files = weight_files(folder) if folder.is_dir() else []
    counts = [safetensors_parameters(file) for file in files]
    if not counts or any(count is None for count in counts):
        return None
    return sum(counts)
