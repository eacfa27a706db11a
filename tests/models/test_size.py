"""``rlcore.models.size``: a model folder's parameters from its safetensors headers, without loading it."""

from __future__ import annotations

import json
import struct

from rlcore.models.size import parameter_count
from rlcore.testing import build_tiny_model


def header_only_safetensors(path, shapes: dict[str, list[int]]) -> None:
    """A safetensors file's header naming ``shapes`` (bf16), its data left out: the count reads only headers."""
    offsets, tensors = 0, {}
    for name, shape in shapes.items():
        size = 2
        for dim in shape:
            size *= dim
        tensors[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offsets, offsets + size]}
        offsets += size
    header = json.dumps({"__metadata__": {"format": "pt"}, **tensors}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def test_a_saved_model_counts_its_parameters_once_each(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    # tied embeddings: one tensor saved, one parameter in the model
    assert parameter_count(str(folder)) == sum(p.numel() for p in model.parameters())


def test_a_sharded_folder_sums_the_shards_its_index_names(tmp_path):
    header_only_safetensors(tmp_path / "a.safetensors", {"x": [1000, 1536], "y": [7]})
    header_only_safetensors(tmp_path / "b.safetensors", {"z": [3, 5]})
    header_only_safetensors(tmp_path / "adapter.safetensors", {"w": [100]})  # not in the index: not the model's
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}}))
    assert parameter_count(str(tmp_path)) == 1000 * 1536 + 7 + 15


def test_what_is_not_safetensors_in_a_folder_gives_none(tmp_path):
    assert parameter_count(str(tmp_path)) is None  # no weights
    (tmp_path / "model.safetensors").write_bytes(b"PK\x03\x04 a zip, not safetensors")
    assert parameter_count(str(tmp_path)) is None
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 4) + b"[1]x")  # a header, but not a table
    assert parameter_count(str(tmp_path)) is None
    assert parameter_count("Qwen/Qwen2.5-0.5B") is None  # a hub id, not a folder
