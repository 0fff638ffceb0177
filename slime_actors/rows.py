"""Rows of a prompt file (.jsonl or .parquet), each with where it is and what is wrong with it -- the one reader
of prompt files (slime_actors.data builds datasets on it; the config counts prompts with it for --num-epoch). It
imports nothing of the package, so any module may use it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

__all__ = ["DataError", "read_rows"]


class DataError(ValueError):
    """A problem with prompt data; `path`, `line` (jsonl, 1-based) / `row` (parquet, 0-based) and `problem`."""

    def __init__(self, problem: str, path: str | None = None, line: int | None = None, row: int | None = None):
        self.problem, self.path, self.line, self.row = problem, path, line, row
        super().__init__(f"{_loc(path, line, row)}: {problem}" if path else problem)


def _loc(path, line=None, row=None) -> str:
    if line is not None:
        return f"{path}:{line}"
    if row is not None:
        return f"{path} row {row}"
    return str(path)


def read_rows(path: str) -> Iterator[tuple[dict[str, int], dict | None, str | None]]:
    """Yield (where, row, problem) for each row of a .jsonl or .parquet file: `where` is {"line": n} (1-based)
    or {"row": n} (0-based); `row` is the decoded object or None when `problem` says why it could not be read.
    A file that cannot be opened raises DataError."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError("file does not exist", path)
    if os.path.isdir(path):
        raise DataError("is a directory, expected a .jsonl or .parquet file", path)
    low = path.lower()
    if low.endswith(".jsonl"):
        return _read_jsonl(path)
    if low.endswith(".parquet"):
        return _read_parquet(path)
    raise DataError("unsupported file type (expected .jsonl or .parquet)", path)


def _read_jsonl(path):
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = {"line": lineno}
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield where, None, f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                yield where, None, f"invalid JSON ({exc.msg} at column {exc.colno})"
                continue
            if not isinstance(obj, dict):
                yield where, None, f"expected a JSON object, got {_tname(obj)}"
                continue
            yield where, obj, None


def _read_parquet(path):
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is a dependency
        raise DataError("reading parquet needs pyarrow (pip install pyarrow)", path) from exc
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:
        raise DataError(f"cannot read parquet file: {type(exc).__name__}: {exc}", path) from exc
    row = 0
    try:
        for batch in pf.iter_batches():
            for obj in batch.to_pylist():
                yield {"row": row}, obj, None
                row += 1
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"cannot read parquet file after {row} rows: {type(exc).__name__}: {exc}", path,
                        row=row) from exc


def _tname(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(v), type(v).__name__)
