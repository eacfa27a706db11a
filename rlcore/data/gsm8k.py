"""``rlcore data gsm8k``: GSM8K as verl-schema parquet, from the Hugging Face hub or local files."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable
from pathlib import Path

from rlcore.cli import Command
from rlcore.data.files import read_records, write_parquet_atomic
from rlcore.errors import RlcoreError

DATA_SOURCE = "openai/gsm8k"
TOOLS_DATA_SOURCE = "rlcore/gsm8k_tools"  # GSM8K's reward plus a bonus for a well-formed tool call
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
# --tools NAME: prompts that ask the model to compute with that tool (multi-turn jobs, docs/tools.md)
TOOL_INSTRUCTIONS = {  # each shows one concrete call: small models copy an example better than a schema
    "calculator": ('Let\'s think step by step. Use the calculator tool for the arithmetic: write a call such as '
                   '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 3 + 4"}}</tool_call> '
                   'and read its result. Then output the final answer after "####".'),
    "python": ('Let\'s think step by step. Use the python tool to compute: write a call such as '
               '<tool_call>{"name": "python", "arguments": {"code": "print(12 * 3 + 4)"}}</tool_call> '
               'and read what it prints. Then output the final answer after "####".'),
}
SPLITS = ("train", "test")
_FINAL_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")  # verl's preprocessing rule


def final_answer(answer: str) -> str | None:
    """The number after the first ``#### `` of a GSM8K answer, commas removed; None if there is none."""
    match = _FINAL_ANSWER.search(answer)
    return match.group(1).replace(",", "") if match else None


def to_row(question: str, answer: str, split: str, index: int, where: str, tool: str | None = None) -> dict:
    """One verl-schema row; ``where`` (file and line) names the record in errors; ``tool``: the prompt
    asks the model to compute with that tool, ``extra_info`` names it, and the data source is
    ``rlcore/gsm8k_tools`` (``rlcore.rewards.gsm8k_tools``)."""
    for field, value in (("question", question), ("answer", answer)):
        if not isinstance(value, str):
            raise RlcoreError(f"{where}: {field!r} is {type(value).__name__}, expected text")
    ground_truth = final_answer(answer)
    if ground_truth is None:
        raise RlcoreError(f"{where}: the answer does not end with '#### <number>': {answer[-80:]!r}")
    extra_info = {"split": split, "index": index, "answer": answer, "question": question}
    return {
        "data_source": TOOLS_DATA_SOURCE if tool else DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {TOOL_INSTRUCTIONS[tool] if tool else INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info | {"tool": tool} if tool else extra_info,
    }


def convert(records: Iterable[tuple[str, dict]], split: str, tool: str | None = None) -> list[dict]:
    return [to_row(record["question"], record["answer"], split, index, where, tool)
            for index, (where, record) in enumerate(records)]


def _split_file(folder: Path, split: str) -> Path:
    """``split.jsonl``, ``split.parquet`` or the hub's ``main/split-*.parquet`` in ``folder``."""
    for pattern in (f"{split}.jsonl", f"{split}.parquet", f"main/{split}-*.parquet", f"{split}-*.parquet"):
        found = sorted(folder.glob(pattern))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise RlcoreError(f"--input {folder}: several files for the {split} split: {', '.join(map(str, found))}")
    raise RlcoreError(f"--input {folder}: no {split}.jsonl or {split}.parquet "
                      f"(nor main/{split}-*.parquet as on the hub) in that folder")


def _split_of(file: Path) -> str:
    """The split a file holds, told by its name (``train.jsonl``, ``test-00000-of-00001.parquet``)."""
    for split in SPLITS:
        if file.name.startswith(split):
            return split
    raise RlcoreError(f"--input {file}: cannot tell the split from the file name; pass --split train or --split test")


def read_local(path: Path, split: str, tool: str | None = None) -> list[dict]:
    """Rows of one split from a jsonl or parquet file, or from a folder holding one per split."""
    if path.is_file():
        return convert(read_records(path, ("question", "answer")), split, tool)
    if not path.is_dir():
        raise RlcoreError(f"--input {path} does not exist: pass a folder holding train.jsonl and test.jsonl "
                          "(GSM8K records with 'question' and 'answer'), parquet files of the same columns, "
                          "or one such file")
    return convert(read_records(_split_file(path, split), ("question", "answer")), split, tool)


def read_hub(split: str, tool: str | None = None) -> list[dict]:
    """openai/gsm8k (config "main") through the ``datasets`` library."""
    advice = ("Pass --input DIR, a folder holding GSM8K's train.jsonl and test.jsonl "
              "(or parquet) with the fields question and answer")
    try:
        import datasets
    except ImportError:
        raise RlcoreError("loading openai/gsm8k from the Hugging Face hub needs the `datasets` package, "
                          f"which is not installed. {advice}, or `pip install datasets`.") from None
    offline = [name for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(name, "") not in ("", "0")]
    try:
        records = datasets.load_dataset("openai/gsm8k", "main", split=split)
    except Exception as exc:  # noqa: BLE001 - network, cache and hub errors all end the same way
        note = f" ({' and '.join(offline)} set)" if offline else ""
        raise RlcoreError(f"could not load openai/gsm8k from the Hugging Face hub{note}: "
                          f"{type(exc).__name__}: {exc}. {advice}.") from None
    return convert(((f"openai/gsm8k {split}, row {i}", r) for i, r in enumerate(records)), split, tool)


def preprocess(local_save_dir: str | os.PathLike, input_path: str | os.PathLike | None = None,
               split: str | None = None, tool: str | None = None) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet`` (or only ``split``'s) into ``local_save_dir``.

    ``input_path``: a folder with a file per split, or one file (its split from ``split`` or its name);
    None reads the Hugging Face hub. ``tool``: prompts for a multi-turn job with that tool
    (``TOOL_INSTRUCTIONS``). Returns the paths written, by split.
    """
    if tool is not None and tool not in TOOL_INSTRUCTIONS:
        raise RlcoreError(f"--tools must be one of {', '.join(TOOL_INSTRUCTIONS)}, got {tool!r}")
    out = Path(local_save_dir).expanduser()
    source = None if input_path is None else Path(input_path).expanduser()
    if split is not None and split not in SPLITS:
        raise RlcoreError(f"--split must be one of {', '.join(SPLITS)}, got {split!r}")
    if source is not None and source.is_file():
        splits = (split or _split_of(source),)
    else:
        splits = (split,) if split else SPLITS
    # Read and check every split before writing anything, so bad input leaves no partial output.
    rows = {name: read_local(source, name, tool) if source is not None else read_hub(name, tool) for name in splits}
    return {name: write_parquet_atomic(split_rows, out / f"{name}.parquet") for name, split_rows in rows.items()}


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--local-save-dir", "--local_save_dir", default="~/data/gsm8k", metavar="DIR",
                        help="folder to write train.parquet and test.parquet into (default: ~/data/gsm8k)")
    parser.add_argument("--input", default=None, metavar="PATH",
                        help="read GSM8K from this folder (train.jsonl and test.jsonl, or parquet) or from one "
                             "such file, instead of the Hugging Face hub")
    parser.add_argument("--split", choices=SPLITS, default=None,
                        help="write only this split (default: both; for one --input file, told by its name)")
    parser.add_argument("--tools", choices=tuple(TOOL_INSTRUCTIONS), default=None, metavar="TOOL",
                        help="prompts for a multi-turn job that ask the model to compute with this tool "
                             f"({', '.join(TOOL_INSTRUCTIONS)}); the job lists it in rollout.multi_turn.tools")


def _run(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    for split, path in preprocess(args.local_save_dir, args.input, args.split, args.tools).items():
        print(f"wrote {pq.read_metadata(path).num_rows} {split} rows to {path}")
    return 0


COMMAND = Command(help="GSM8K (openai/gsm8k) as verl-schema parquet", configure=_configure, run=_run)
