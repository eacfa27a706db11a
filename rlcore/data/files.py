"""Reading question files (jsonl, parquet) with row-exact errors, and writing parquet atomically."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from rlcore.errors import RlcoreError
from rlcore.runtime.atomic import publish, staging_file


def read_records(path: Path, columns: Sequence[str]) -> Iterator[tuple[str, dict]]:
    """(where, record) for each row of a jsonl (or gzipped ``.jsonl.gz``) or parquet file; ``where``
    names the file and line/row."""
    if not path.is_file():
        raise RlcoreError(f"{path} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        present = pq.read_schema(path).names
        missing = [c for c in columns if c not in present]
        if missing:
            raise RlcoreError(f"{path} has no column {', '.join(map(repr, missing))}; "
                              f"its columns: {', '.join(present)}")
        for index, record in enumerate(pq.read_table(path, columns=list(columns)).to_pylist()):
            yield f"{path}, row {index}", record
        return
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RlcoreError(f"{where}: not valid JSON ({exc})") from None
            if not isinstance(record, dict):
                raise RlcoreError(f"{where}: expected a JSON object, got {type(record).__name__}")
            missing = [c for c in columns if c not in record]
            if missing:
                raise RlcoreError(f"{where}: no field {', '.join(map(repr, missing))}; "
                                  f"its fields: {', '.join(record) or '(none)'}")
            yield where, record


def write_parquet_atomic(rows: list[dict], path: Path, column_types: dict | None = None) -> Path:
    """Write ``rows`` to ``path`` through a temporary file in the same folder, so a crash leaves no half file.
    ``column_types``: pyarrow types for columns whose type the values alone do not fix (a path always None)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    for name, kind in (column_types or {}).items():
        table = table.set_column(table.schema.get_field_index(name), name, table.column(name).cast(kind))
    blocking = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise RlcoreError(f"cannot write {path}: {blocking} is a file, not a folder (give --local-save-dir a folder)")
    try:
        temporary = staging_file(path)
    except OSError as exc:
        raise RlcoreError(f"cannot write {path}: {exc.strerror or exc} (check --local-save-dir)") from None
    try:
        pq.write_table(table, temporary)
        publish(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def write_train_and_test(local_save_dir: str | os.PathLike, rows_of: Callable[[str, int], list[dict]],
                         train_size: int, test_size: int, column_types: dict | None = None) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet`` of a generated task into ``local_save_dir``
    (``rows_of(split, size)``: the split's rows); returns the paths by split. A size below 1 is refused
    by its option's name."""
    for name, size in (("--train-size", train_size), ("--test-size", test_size)):
        if size < 1:
            raise RlcoreError(f"{name} must be at least 1, got {size}")
    out = Path(local_save_dir).expanduser()
    return {split: write_parquet_atomic(rows_of(split, size), out / f"{split}.parquet", column_types)
            for split, size in (("train", train_size), ("test", test_size))}
