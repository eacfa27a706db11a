"""``rlcore data gsm8k``: verl's schema and values, from local jsonl or parquet; clear errors; atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlcore.data import gsm8k
from rlcore.errors import RlcoreError
from tests.conftest import SHARED, require_shared, run_rlcore

GSM8K = SHARED / "data" / "gsm8k"
INSTRUCTION = ' Let\'s think step by step and output the final answer after "####".'
SIZES = {"train": 12, "test": 5}


def _head(path: Path, count: int) -> list[dict]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(next(lines)) for _ in range(count)]


@pytest.fixture
def records() -> dict[str, list[dict]]:
    """The first few GSM8K problems of each split, as the shared jsonl holds them."""
    require_shared(GSM8K, "GSM8K")
    return {split: _head(GSM8K / f"{split}.jsonl", count) for split, count in SIZES.items()}


def _write_jsonl(folder: Path, records: dict[str, list[dict]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in records.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder


def _expected(record: dict, split: str, index: int) -> dict:
    truth = record["answer"].split("####")[-1].strip().replace(",", "")
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": record["question"] + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "answer": record["answer"], "question": record["question"]},
    }


def _check_output(out: Path, records: dict[str, list[dict]]) -> None:
    for split, rows in records.items():
        table = pq.read_table(out / f"{split}.parquet")
        assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        assert table.to_pylist() == [_expected(r, split, i) for i, r in enumerate(rows)]


def test_local_jsonl_becomes_verl_schema(tmp_path, records):
    paths = gsm8k.preprocess(tmp_path / "out", _write_jsonl(tmp_path / "in", records))
    assert set(paths) == {"train", "test"}
    _check_output(tmp_path / "out", records)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["test.parquet", "train.parquet"]


def test_hub_layout_parquet_input_gives_the_same_rows(tmp_path, records):
    for split, rows in records.items():
        folder = tmp_path / "in" / "main"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), folder / f"{split}-00000-of-00001.parquet")
    gsm8k.preprocess(tmp_path / "out", tmp_path / "in")
    _check_output(tmp_path / "out", records)


def test_final_answer_follows_verl():
    assert gsm8k.final_answer("so\n#### 1,234") == "1234"
    assert gsm8k.final_answer("#### -5") == "-5"
    assert gsm8k.final_answer("no marker 5") is None


def test_a_row_without_an_answer_is_named_and_nothing_is_written(tmp_path, records):
    records["test"][2] = {"question": "q", "answer": "forty two"}
    with pytest.raises(RlcoreError, match=r"test\.jsonl, line 3: the answer does not end with '#### <number>'"):
        gsm8k.preprocess(tmp_path / "out", _write_jsonl(tmp_path / "in", records))
    assert not (tmp_path / "out").exists()  # train was fine, but nothing is written before all is read


@pytest.mark.parametrize("line, message", [
    ('{"question": "q"}\n', r"train\.jsonl, line 2: no field 'answer'"),
    ("{not json\n", r"train\.jsonl, line 2: not valid JSON"),
    ('{"question": "q", "answer": 7}\n', r"train\.jsonl, line 2: 'answer' is int"),
])
def test_bad_jsonl_rows_are_named(tmp_path, records, line, message):
    folder = _write_jsonl(tmp_path / "in", records)
    with (folder / "train.jsonl").open("r+", encoding="utf-8") as f:
        first = f.readline()
        f.seek(0)
        f.truncate()
        f.write(first + line)
    with pytest.raises(RlcoreError, match=message):
        gsm8k.preprocess(tmp_path / "out", folder)


def test_parquet_with_wrong_columns_is_named(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for split in ("train", "test"):
        pq.write_table(pa.Table.from_pylist([{"problem": "q", "solution": "#### 1"}]), folder / f"{split}.parquet")
    with pytest.raises(RlcoreError, match=r"train\.parquet has no column 'question', 'answer'; its columns: problem"):
        gsm8k.preprocess(tmp_path / "out", folder)


def test_missing_input_is_explained(tmp_path, records):
    with pytest.raises(RlcoreError, match=r"--input .*nowhere does not exist: pass a folder holding train\.jsonl"):
        gsm8k.preprocess(tmp_path / "out", tmp_path / "nowhere")
    folder = _write_jsonl(tmp_path / "in", records)
    (folder / "test.jsonl").unlink()
    with pytest.raises(RlcoreError, match=r"no test\.jsonl or test\.parquet"):
        gsm8k.preprocess(tmp_path / "out", folder)


def test_a_failed_write_leaves_no_file(tmp_path, records, monkeypatch):
    def crash(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", crash)
    with pytest.raises(OSError, match="disk full"):
        gsm8k.preprocess(tmp_path / "out", _write_jsonl(tmp_path / "in", records))
    assert list((tmp_path / "out").iterdir()) == []


def test_cli_end_to_end(tmp_path, records):
    folder = _write_jsonl(tmp_path / "in", records)
    result = run_rlcore("data", "gsm8k", "--local-save-dir", str(tmp_path / "out"), "--input", str(folder))
    assert result.returncode == 0, result.stderr
    assert "wrote 12 train rows" in result.stdout and "wrote 5 test rows" in result.stdout
    _check_output(tmp_path / "out", records)


def test_cli_without_input_offline_says_what_to_do(tmp_path):
    result = run_rlcore("data", "gsm8k", "--local-save-dir", str(tmp_path / "out"),
                        env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "openai/gsm8k" in result.stderr and "--input" in result.stderr
    try:
        import datasets  # noqa: F401
    except ImportError:
        assert "`datasets` package" in result.stderr
    assert not (tmp_path / "out").exists()


def test_one_input_file_writes_its_split(tmp_path, records):
    folder = _write_jsonl(tmp_path / "in", records)
    assert set(gsm8k.preprocess(tmp_path / "out", folder / "test.jsonl")) == {"test"}
    assert not (tmp_path / "out" / "train.parquet").exists()
    assert set(gsm8k.preprocess(tmp_path / "out", folder / "train.jsonl")) == {"train"}
    _check_output(tmp_path / "out", records)
    (folder / "train.jsonl").rename(folder / "problems.jsonl")
    with pytest.raises(RlcoreError, match=r"problems\.jsonl: cannot tell the split .* --split train"):
        gsm8k.preprocess(tmp_path / "other", folder / "problems.jsonl")
    gsm8k.preprocess(tmp_path / "other", folder / "problems.jsonl", split="train")
    assert pq.read_table(tmp_path / "other" / "train.parquet").to_pylist() == pq.read_table(
        tmp_path / "out" / "train.parquet").to_pylist()
    assert set(gsm8k.preprocess(tmp_path / "only", folder, split="test")) == {"test"}


def test_tools_option_writes_prompts_that_ask_for_the_tool(tmp_path, records):
    folder = _write_jsonl(tmp_path / "in", records)
    result = run_rlcore("data", "gsm8k", "--local-save-dir", str(tmp_path / "out"), "--input", str(folder),
                        "--tools", "calculator")
    assert result.returncode == 0, result.stderr
    for split, rows in records.items():
        written = pq.read_table(tmp_path / "out" / f"{split}.parquet").to_pylist()
        plain = [_expected(r, split, i) for i, r in enumerate(rows)]
        assert len(written) == len(plain)
        for row, expected in zip(written, plain):
            content = row["prompt"][0]["content"]
            assert content.startswith(expected["extra_info"]["question"] + " ")
            assert "calculator tool" in content and content.endswith('output the final answer after "####".')
            # the rest is the plain row but for the data source (GSM8K's reward plus a tool-call bonus)
            assert {k: v for k, v in row.items() if k != "prompt"} == {
                k: v for k, v in expected.items() if k != "prompt"} | {
                    "data_source": "rlcore/gsm8k_tools", "extra_info": expected["extra_info"] | {"tool": "calculator"}}
    bad = run_rlcore("data", "gsm8k", "--local-save-dir", str(tmp_path / "x"), "--input", str(folder),
                     "--tools", "abacus")
    assert bad.returncode == 2 and "calculator" in bad.stderr and "python" in bad.stderr
