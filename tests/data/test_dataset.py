"""``PromptDataset`` and ``PromptLoader``: chat template, long prompts, many files, seeded resumable batches."""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlcore.config.schema import DataConfig
from rlcore.data.dataset import PromptDataset, PromptLoader
from rlcore.errors import RlcoreError
from rlcore.testing import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _rows(count: int, start: int = 0, words: int = 1) -> list[dict]:
    return [{
        "data_source": "rlcore/arithmetic",
        "prompt": [{"role": "user", "content": f"What is {i} + {i}?" + " plus" * (words * (i % 4))}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
        "extra_info": {"split": "train", "index": i},
    } for i in range(start, start + count)]


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _encode(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_prompts_go_through_the_chat_template(tmp_path, tokenizer):
    rows = _rows(6)
    dataset = PromptDataset(str(_parquet(tmp_path / "a.parquet", rows)), tokenizer, DataConfig(), "train")
    assert len(dataset) == 6 and dataset.num_filtered == 0
    for i, row in enumerate(rows):
        item = dataset[i]
        assert item["input_ids"].tolist() == _encode(tokenizer, row["prompt"])
        assert tokenizer.decode(item["input_ids"]).endswith("<|im_start|>assistant\n")
        assert item["raw_prompt"] == row["prompt"]
        assert item["ground_truth"] == row["reward_model"]["ground_truth"]
        assert item["data_source"] == "rlcore/arithmetic" and item["extra_info"] == row["extra_info"]


def test_chat_template_arguments_reach_the_template(tmp_path):
    """verl's data.apply_chat_template_kwargs (enable_thinking, reasoning_effort, ...)."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                               "{% if reasoning_effort is defined %} effort {{ reasoning_effort }}{% endif %}")
    path = str(_parquet(tmp_path / "a.parquet", _rows(1)))
    plain = PromptDataset(path, tokenizer, DataConfig(), "train")[0]["input_ids"]
    config = DataConfig(apply_chat_template_kwargs={"reasoning_effort": "high"})
    effort = PromptDataset(path, tokenizer, config, "train")[0]["input_ids"]
    assert tokenizer.decode(plain) == "What is 0 + 0?"
    assert tokenizer.decode(effort) == "What is 0 + 0? effort high"


def test_many_files_and_folders_are_read_in_order(tmp_path, tokenizer):
    _parquet(tmp_path / "a.parquet", _rows(3))
    (tmp_path / "more").mkdir()
    _parquet(tmp_path / "more" / "b.parquet", _rows(2, start=10))
    _parquet(tmp_path / "more" / "c.parquet", _rows(4, start=20))
    dataset = PromptDataset([tmp_path / "a.parquet", tmp_path / "more"], tokenizer, DataConfig(), "train")
    assert [dataset[i]["ground_truth"] for i in range(len(dataset))] == [
        str(2 * i) for i in [0, 1, 2, 10, 11, 20, 21, 22, 23]]


def test_a_string_prompt_is_one_user_message(tmp_path, tokenizer):
    rows = [dict(_rows(1)[0], prompt="What is 1 + 1?")]
    dataset = PromptDataset(_parquet(tmp_path / "a.parquet", rows), tokenizer, DataConfig(), "train")
    assert dataset[0]["raw_prompt"] == [{"role": "user", "content": "What is 1 + 1?"}]


def test_missing_file_or_column_is_named(tmp_path, tokenizer):
    with pytest.raises(RlcoreError, match=r"train data file .*nope\.parquet does not exist"):
        PromptDataset([tmp_path / "nope.parquet"], tokenizer, DataConfig(), "train")
    rows = [{k: v for k, v in row.items() if k != "reward_model"} for row in _rows(2)]
    path = _parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(RlcoreError, match=r"val data file .*bad\.parquet has no column 'reward_model'"):
        PromptDataset([path], tokenizer, DataConfig(), "val")
    with pytest.raises(RlcoreError, match=r"no column 'question' \(data\.prompt_key = 'question'\)"):
        PromptDataset([_parquet(tmp_path / "ok.parquet", _rows(2))], tokenizer,
                      DataConfig(prompt_key="question"), "val")
    with pytest.raises(RlcoreError, match="no train data files"):
        PromptDataset([], tokenizer, DataConfig(), "train")


def test_a_bad_prompt_cell_is_named(tmp_path, tokenizer):
    rows = _rows(3)
    rows[1]["prompt"] = [{"role": "user", "content": ""}]
    rows[2]["prompt"] = []
    path = _parquet(tmp_path / "a.parquet", rows)
    with pytest.raises(RlcoreError, match=r"a\.parquet, row 2: the prompt must be a non-empty list"):
        PromptDataset(path, tokenizer, DataConfig(), "train")


def test_a_data_source_that_is_not_text_is_named_with_its_row(tmp_path, tokenizer):
    rows = _rows(3)
    for i, row in enumerate(rows):
        row["data_source"] = i  # a column of integers
    path = _parquet(tmp_path / "ints.parquet", rows)
    with pytest.raises(RlcoreError, match=r"ints\.parquet, row 0: data_source is 0 \(int\); expected text"):
        PromptDataset(path, tokenizer, DataConfig(), "train")


def test_a_damaged_page_is_named_with_its_file(tmp_path, tokenizer):
    good = _parquet(tmp_path / "good.parquet", _rows(50))
    data = bytearray(good.read_bytes())
    middle = len(data) // 3
    data[middle:middle + 200] = b"\xff" * 200  # a data page, not the footer: the schema still reads
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(bytes(data))
    pq.read_schema(damaged)
    with pytest.raises(RlcoreError, match=r"train data file .*damaged\.parquet (could not be read|is not a readable)"):
        PromptDataset(damaged, tokenizer, DataConfig(), "train")


def _lengths(tokenizer, rows):
    return [len(_encode(tokenizer, r["prompt"])) for r in rows]


def test_long_prompts_are_dropped_and_counted(tmp_path, tokenizer, caplog):
    rows = _rows(8, words=5)
    lengths = _lengths(tokenizer, rows)
    limit = sorted(lengths)[4]
    config = DataConfig(max_prompt_length=limit, filter_overlong_prompts=True)
    with caplog.at_level(logging.WARNING, logger="rlcore.data.dataset"):
        dataset = PromptDataset(_parquet(tmp_path / "a.parquet", rows), tokenizer, config, "train")
    dropped = sum(n > limit for n in lengths)
    assert dropped > 0 and dataset.num_filtered == dropped and len(dataset) == 8 - dropped
    assert f"dropped {dropped} of 8 prompts longer than data.max_prompt_length = {limit}" in caplog.text
    kept = [r["reward_model"]["ground_truth"] for r, n in zip(rows, lengths) if n <= limit]
    assert [dataset[i]["ground_truth"] for i in range(len(dataset))] == kept
    with pytest.raises(RlcoreError, match=r"no train prompts left .* 8 longer than data.max_prompt_length dropped"):
        PromptDataset(tmp_path / "a.parquet", tokenizer, DataConfig(max_prompt_length=2, filter_overlong_prompts=True))


def test_a_long_prompt_is_an_error_naming_its_row(tmp_path, tokenizer):
    rows = _rows(8, words=5)
    lengths = _lengths(tokenizer, rows)
    first_long = next(i for i, n in enumerate(lengths) if n > min(lengths))
    config = DataConfig(max_prompt_length=min(lengths), truncation="error")
    with pytest.raises(RlcoreError, match=rf"a\.parquet, row {first_long}: the prompt is {lengths[first_long]} "
                                          rf"tokens, longer than data.max_prompt_length = {min(lengths)}"):
        PromptDataset(_parquet(tmp_path / "a.parquet", rows), tokenizer, config, "train")


@pytest.mark.parametrize("side", ["left", "right"])
def test_long_prompts_are_truncated(tmp_path, tokenizer, side):
    rows = _rows(4, words=5)
    limit = min(_lengths(tokenizer, rows))
    dataset = PromptDataset(_parquet(tmp_path / "a.parquet", rows), tokenizer,
                            DataConfig(max_prompt_length=limit, truncation=side), "train")
    assert len(dataset) == 4
    for i, row in enumerate(rows):
        full = _encode(tokenizer, row["prompt"])
        assert dataset[i]["input_ids"].tolist() == (full[-limit:] if side == "left" else full[:limit])


def test_batches_are_left_padded_with_positions(tmp_path, tokenizer):
    rows = _rows(4, words=3)
    dataset = PromptDataset(_parquet(tmp_path / "a.parquet", rows), tokenizer, DataConfig(), "train")
    batch = next(iter(PromptLoader(dataset, batch_size=4, shuffle=False)))
    ids, mask, positions = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    width = max(_lengths(tokenizer, rows))
    assert ids.shape == mask.shape == positions.shape == (4, width)
    for i, row in enumerate(rows):
        full = _encode(tokenizer, row["prompt"])
        pad = width - len(full)
        assert ids[i].tolist() == [tokenizer.pad_token_id] * pad + full
        assert mask[i].tolist() == [0] * pad + [1] * len(full)
        assert positions[i].tolist() == [0] * pad + list(range(len(full)))
    assert batch["raw_prompt"] == [r["prompt"] for r in rows]
    assert batch["ground_truth"] == ["0", "2", "4", "6"]
    assert batch["uid"] == ["train-0-e0", "train-1-e0", "train-2-e0", "train-3-e0"]
    assert set(batch.rows) == {"data_source", "ground_truth", "extra_info", "raw_prompt", "uid"}


def test_without_a_pad_token_prompts_are_padded_with_eos(tmp_path):
    tokenizer = build_tiny_tokenizer()
    tokenizer.pad_token = None
    dataset = PromptDataset(_parquet(tmp_path / "a.parquet", _rows(2, words=3)), tokenizer, DataConfig(), "train")
    ids = next(iter(PromptLoader(dataset, batch_size=2, shuffle=False)))["input_ids"]
    assert ids[0, 0].item() == tokenizer.eos_token_id


@pytest.fixture
def dataset(tmp_path, tokenizer):
    return PromptDataset(_parquet(tmp_path / "a.parquet", _rows(23)), tokenizer, DataConfig(), "train")


def _truths(batches):
    return [b["ground_truth"] for b in batches]


def test_loader_order_is_seeded_and_covers_each_epoch(dataset):
    loader = PromptLoader(dataset, batch_size=5, shuffle=True, seed=7)
    assert len(loader) == 4  # 23 prompts: the last 3 are left out (drop_last)
    epoch0, epoch1 = list(loader), list(loader)
    assert len(epoch0) == len(epoch1) == 4
    assert _truths(epoch0) == _truths(list(PromptLoader(dataset, batch_size=5, shuffle=True, seed=7)))
    assert _truths(epoch0) != _truths(epoch1)
    assert _truths(epoch0) != _truths(list(PromptLoader(dataset, batch_size=5, shuffle=True, seed=8)))
    assert len({t for b in epoch0 for t in b["ground_truth"]}) == 20
    assert all(uid.endswith("-e1") for b in epoch1 for uid in b["uid"])
    assert PromptLoader(dataset, batch_size=5, shuffle=False).order(3) == list(range(23))
    assert len(PromptLoader(dataset, batch_size=5, drop_last=False)) == 5
    assert len(list(PromptLoader(dataset, batch_size=5, drop_last=False))[-1]) == 3


@pytest.mark.parametrize("stop_after", [1, 3, 4, 6])
def test_a_resumed_loader_continues_with_the_next_batch(dataset, stop_after):
    def stream(loader, count):
        batches = []
        while len(batches) < count:
            for batch in loader:
                batches.append(batch)
                if len(batches) == count:
                    break
        return batches

    reference = stream(PromptLoader(dataset, batch_size=5, seed=3), 10)
    first = PromptLoader(dataset, batch_size=5, seed=3)
    seen = stream(first, stop_after)
    state = first.state_dict()
    resumed = PromptLoader(dataset, batch_size=5, seed=3)
    resumed.load_state_dict(state)
    rest = stream(resumed, 10 - stop_after)
    assert [b["uid"] for b in seen + rest] == [b["uid"] for b in reference]
    assert _truths(seen + rest) == _truths(reference)


def test_a_dataset_smaller_than_a_batch_is_refused(dataset):
    with pytest.raises(RlcoreError, match=r"23 prompts, fewer than one batch of 24 \(data.train_batch_size\)"):
        PromptLoader(dataset, batch_size=24)


def test_a_loader_resumed_on_changed_data_warns(dataset, caplog):
    state = PromptLoader(dataset, batch_size=5).state_dict() | {"num_prompts": 40}
    with caplog.at_level(logging.WARNING, logger="rlcore.data.dataset"):
        PromptLoader(dataset, batch_size=5).load_state_dict(state)
    assert "num_prompts 40 -> 23" in caplog.text


def test_next_batch_crosses_epochs_like_iteration(dataset):
    stepped = PromptLoader(dataset, batch_size=5, seed=2)
    iterated = PromptLoader(dataset, batch_size=5, seed=2)
    expected = list(iterated) + list(iterated)
    got = [stepped.next_batch() for _ in range(8)]
    assert [b["uid"] for b in got] == [b["uid"] for b in expected]
    assert stepped.state_dict() == iterated.state_dict() == {
        "epoch": 2, "position": 0, "num_prompts": 23, "batch_size": 5, "seed": 2}
    resumed = PromptLoader(dataset, batch_size=5, seed=2)
    halfway = PromptLoader(dataset, batch_size=5, seed=2)
    [halfway.next_batch() for _ in range(3)]
    resumed.load_state_dict(halfway.state_dict())
    assert [resumed.next_batch()["uid"] for _ in range(5)] == [b["uid"] for b in expected[3:]]


def test_validation_batches_cover_every_prompt_in_order(dataset):
    batches = list(dataset.batches(10))
    assert [len(b) for b in batches] == [10, 10, 3]
    assert [u for b in batches for u in b["uid"]] == [f"train-{i}-e0" for i in range(23)]
    assert [t for b in batches for t in b["ground_truth"]] == [str(2 * i) for i in range(23)]


def test_empty_media_cells_are_text_and_videos_are_refused_naming_the_row(tmp_path, tokenizer):
    """verl's mixed datasets leave the media cells of text-only rows empty: read as text. Images are
    read and checked (tests/data/test_images.py); a row with videos is refused rather than trained on
    its text with the videos dropped."""
    rows = _rows(3)
    for row in rows:
        row["images"] = []
    text_only = PromptDataset(_parquet(tmp_path / "empty.parquet", rows), tokenizer, DataConfig(), "train")
    assert [text_only[i]["ground_truth"] for i in range(3)] == ["0", "2", "4"]
    assert text_only[0]["images"] == [] and not text_only.has_images
    video = [dict(row, videos=["clip.mp4"] if i == 0 else None) for i, row in enumerate(_rows(2))]
    with pytest.raises(RlcoreError, match=r"val data file .*video\.parquet, row 0: column 'videos'"):
        PromptDataset(_parquet(tmp_path / "video.parquet", video), tokenizer, DataConfig(), "val")
