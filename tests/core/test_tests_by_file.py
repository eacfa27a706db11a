"""benchmarks/tests_by_file.py: a test directory run file by file under a budget, resumed by the same
command, a file that cannot fit one call recorded as such; real pytest processes on a small directory."""

import sys
import textwrap

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import tests_by_file  # noqa: E402

FILES = {
    "test_a.py": """
        import pytest

        def test_one():
            assert 1 + 1 == 2

        def test_two():
            assert "a" * 2 == "aa"

        def test_three():
            pytest.skip("needs 2 GPUs")
    """,
    "test_b.py": """
        def test_wrong():
            assert 2 + 2 == 5
    """,
    "test_c.py": """
        import time

        def test_slow():
            time.sleep(120)
    """,
}


def write_directory(root):
    directory = root / "suite"
    directory.mkdir()
    for name, text in FILES.items():
        (directory / name).write_text(textwrap.dedent(text))
    return directory


def test_pytests_summary_line_gives_the_counts():
    output = "SKIPPED [1] x.py:3: 2 passed in spirit\n= 2 failed, 3 passed, 1 skipped, 1 error, 4 warnings in 3.20s ="
    assert tests_by_file.counts(output) == {"failed": 2, "passed": 3, "skipped": 1, "error": 1}
    assert tests_by_file.counts("no summary here") == {}


def test_the_slow_file_first_then_the_rest_and_a_second_call_goes_on(tmp_path):
    directory, results = write_directory(tmp_path), tmp_path / "results"

    # call 1: test_c first, with the whole call to itself, cannot finish: recorded as not fitting one call
    done = tests_by_file.run(directory, results, budget=8, min_start=1, first=["test_c.py"], pytest_args=[])
    assert [r["file"] for r in done][0].endswith("test_c.py") and done[0]["cut_short"]
    assert tests_by_file.record_of(results, directory / "test_c.py")["cut_short"]
    # whatever else ran in the seconds left is recorded only if it finished

    # call 2 (the same command): the files without a record, test_c not again
    second = tests_by_file.run(directory, results, budget=120, min_start=1, first=["test_c.py"], pytest_args=[])
    assert not any(r["file"].endswith("test_c.py") for r in second)
    a = tests_by_file.record_of(results, directory / "test_a.py")
    b = tests_by_file.record_of(results, directory / "test_b.py")
    assert a["counts"] == {"passed": 2, "skipped": 1} and a["status"] == 0 and not a["cut_short"]
    assert b["counts"] == {"failed": 1} and b["status"] == 1

    table = tests_by_file.table(results, directory)
    assert "| test_a.py | 2 passed, 1 skipped (" in table
    assert "| test_b.py | 1 failed (" in table and "exit status 1" in table
    assert "| test_c.py | cut short at 8 s" in table

    # call 3: nothing left to run
    assert tests_by_file.run(directory, results, budget=60, min_start=1, first=[], pytest_args=[]) == []


def test_a_file_cut_short_after_others_ran_in_the_call_is_run_again_by_the_next(tmp_path):
    directory, results = write_directory(tmp_path), tmp_path / "results"
    (directory / "test_b.py").unlink()
    (directory / "test_c.py").rename(directory / "test_z.py")  # after test_a in name order
    done = tests_by_file.run(directory, results, budget=12, min_start=1, first=[], pytest_args=[])
    assert [r["file"].rsplit("/", 1)[-1] for r in done] == ["test_a.py", "test_z.py"]
    assert done[-1]["cut_short"]
    assert tests_by_file.record_of(results, directory / "test_z.py") is None  # to run again, from its start
    assert "| test_z.py | not run |" in tests_by_file.table(results, directory)


def test_no_file_starts_with_less_than_the_minimum_left(tmp_path, capsys):
    directory, results = write_directory(tmp_path), tmp_path / "results"
    assert tests_by_file.run(directory, results, budget=5, min_start=30, first=[], pytest_args=[]) == []
    assert "not started, 5 s left" in capsys.readouterr().out


def test_the_documented_command_with_first_files_and_pytest_arguments_runs(tmp_path, capsys):
    # "--first a.py b.py -- -s" was refused by argparse ("unrecognized arguments: -- -s") on the GPU
    # machine: no file ran
    directory, results = write_directory(tmp_path), tmp_path / "results"
    (directory / "test_c.py").unlink()
    code = tests_by_file.main(["run", str(directory), "--results", str(results), "--budget", "120", "--min-start", "1",
                               "--first", "test_b.py", "test_a.py", "--", "-s", "-k", "not three"])
    records = {name: tests_by_file.record_of(results, directory / name) for name in ("test_a.py", "test_b.py")}
    assert records["test_a.py"]["counts"] == {"passed": 2, "deselected": 1}  # the pytest arguments reached pytest
    assert records["test_b.py"]["counts"] == {"failed": 1}
    assert code == 1 and "| test_a.py |" in capsys.readouterr().out
