"""``rlcore data arithmetic``: seeded, sized, difficulty by options, graded by the rlcore/arithmetic scorer."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest

from rlcore.cli import main
from rlcore.data.arithmetic import ArithmeticTask, generate, write
from rlcore.errors import RlcoreError
from rlcore.rewards.arithmetic import compute_score


def test_same_seed_same_rows_other_seed_other_rows():
    task = ArithmeticTask(max_operand=99)
    assert generate(task, "train", 50, seed=3) == generate(task, "train", 50, seed=3)
    assert generate(task, "train", 50, seed=3) != generate(task, "train", 50, seed=4)
    assert generate(task, "train", 50, seed=3) != generate(task, "test", 50, seed=3)
    assert generate(task, "train", 20, seed=3) == generate(task, "train", 50, seed=3)[:20]


def test_difficulty_options_shape_the_problems():
    task = ArithmeticTask(num_operands=3, min_operand=-4, max_operand=12, operators="-*")
    rows = generate(task, "test", 200, seed=0)
    seen_operators = set()
    for index, row in enumerate(rows):
        assert row["data_source"] == "rlcore/arithmetic"
        assert row["extra_info"]["index"] == index and row["extra_info"]["split"] == "test"
        question = row["extra_info"]["question"]
        expression = re.fullmatch(r"What is (.*)\?", question).group(1)
        tokens = expression.replace("(", "").replace(")", "").split(" ")
        operands, operators = [int(n) for n in tokens[0::2]], tokens[1::2]
        assert len(operands) == 3 and all(-4 <= n <= 12 for n in operands)
        seen_operators.update(operators)
        assert set(operators) <= {"-", "*"}
        assert row["reward_model"] == {"style": "rule", "ground_truth": str(eval(expression))}
        assert row["prompt"][0]["content"] == question + ' Give only the final answer after "####".'
    assert seen_operators == {"-", "*"}


def test_the_scorer_grades_generated_answers():
    rows = generate(ArithmeticTask(unformatted_score=0.5), "train", 20, seed=1)
    for row in rows:
        truth, info = row["reward_model"]["ground_truth"], row["extra_info"]
        assert compute_score("rlcore/arithmetic", info["answer"], truth, info)["score"] == 1.0
        assert compute_score("rlcore/arithmetic", f"It is {truth}.", truth, info)["score"] == 0.5
        assert compute_score("rlcore/arithmetic", f"It is {int(truth) + 1}.", truth, info)["score"] == 0.0


@pytest.mark.parametrize("task, message", [
    (ArithmeticTask(num_operands=1), "--num-operands"),
    (ArithmeticTask(min_operand=5, max_operand=2), "--min-operand 5 is above --max-operand 2"),
    (ArithmeticTask(operators="+/"), "--operators"),
    (ArithmeticTask(unformatted_score=2.0), "--unformatted-score"),
])
def test_bad_options_are_refused(task, message):
    with pytest.raises(RlcoreError, match=message):
        generate(task, "train", 1, seed=0)


def test_cli_writes_sized_splits(tmp_path, capsys):
    argv = ["data", "arithmetic", "--local-save-dir", str(tmp_path), "--train-size", "30", "--test-size", "7",
            "--seed", "5", "--operators", "+-", "--max-operand", "20"]
    assert main(argv) == 0
    assert "wrote 30 train rows" in capsys.readouterr().out
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert len(train) == 30 and pq.read_metadata(tmp_path / "test.parquet").num_rows == 7
    assert train == generate(ArithmeticTask(operators="+-", max_operand=20), "train", 30, seed=5)
    assert main(["data", "arithmetic", "--local-save-dir", str(tmp_path), "--train-size", "0"]) == 2


def test_write_is_seeded(tmp_path):
    task = ArithmeticTask()
    write(tmp_path / "a", task, 10, 3, seed=9)
    write(tmp_path / "b", task, 10, 3, seed=9)
    for split in ("train", "test"):
        assert pq.read_table(tmp_path / "a" / f"{split}.parquet") == pq.read_table(tmp_path / "b" / f"{split}.parquet")


@pytest.mark.parametrize("inside", [False, True])
def test_a_save_dir_that_is_a_file_is_one_error(tmp_path, capsys, inside):
    blocking = tmp_path / "taken"
    blocking.write_text("not a folder")
    save_dir = blocking / "data" if inside else blocking
    assert main(["data", "arithmetic", "--local-save-dir", str(save_dir), "--train-size", "4", "--test-size", "2"]) == 2
    error = capsys.readouterr().err
    assert f"{blocking} is a file, not a folder" in error and "Traceback" not in error
    assert blocking.read_text() == "not a folder"
