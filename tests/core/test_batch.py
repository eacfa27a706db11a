import pytest
import torch

from rlcore.batch import Batch


def test_concat_left_pads_prompts_of_different_widths():
    a = Batch({"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.tensor([[1, 1]]),
               "responses": torch.tensor([[7]])}, {"uid": ["a"]})
    b = Batch({"input_ids": torch.tensor([[1, 2, 3]]), "attention_mask": torch.tensor([[1, 1, 1]]),
               "responses": torch.tensor([[8]])}, {"uid": ["b"]})
    merged = Batch.concat([a, b], left_pad={"input_ids": 0, "attention_mask": 0})
    assert merged["input_ids"].tolist() == [[0, 5, 6], [1, 2, 3]]
    assert merged["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert merged["uid"] == ["a", "b"]
    with pytest.raises(RuntimeError):
        Batch.concat([a, b])  # without padding the widths must match


def test_concat_left_pads_the_width_of_a_per_position_column_with_more_dimensions():
    a = Batch({"routed_experts": torch.zeros(1, 2, 3, 2, dtype=torch.int16)})  # (B, P+R, L, K)
    b = Batch({"routed_experts": torch.ones(1, 4, 3, 2, dtype=torch.int16)})
    merged = Batch.concat([a, b], left_pad={"routed_experts": -1})["routed_experts"]
    assert merged.shape == (2, 4, 3, 2) and merged.dtype == torch.int16
    assert (merged[0, :2] == -1).all() and (merged[0, 2:] == 0).all() and (merged[1] == 1).all()


def test_select_split_repeat_and_chunk():
    batch = Batch({"x": torch.arange(4).unsqueeze(1)}, {"uid": list("abcd")})
    assert batch.select([2, 0])["uid"] == ["c", "a"]
    assert [len(b) for b in batch.split(3)] == [3, 1]
    assert batch.select([0, 1]).repeat_interleave(2)["uid"] == ["a", "a", "b", "b"]
    with pytest.raises(ValueError, match="do not divide"):
        batch.chunk(3)
    with pytest.raises(ValueError, match="differ in length"):
        Batch({"x": torch.zeros(2)}, {"uid": ["a"]})


def test_select_takes_each_columns_rows_on_the_device_it_is_on(monkeypatch):
    """The index goes to each device once, however many columns are there (a copy to an accelerator from
    pageable memory waits for the device)."""
    batch = Batch({"x": torch.arange(4), "y": torch.arange(4) * 10, "z": torch.zeros(4, 2, device="meta")})
    copies = []
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: copies.append(a) or to(self, *a, **k))
    picked = batch.select([3, 1])
    assert picked["x"].tolist() == [3, 1] and picked["y"].tolist() == [30, 10]
    assert picked["z"].device.type == "meta" and picked["z"].shape == (2, 2)
    assert sorted(str(device) for (device,) in copies) == ["cpu", "meta"]
