"""Rows of a prompt file (.jsonl or .parquet): read in bounded memory, each with where it is and what is wrong with
it -- the one reader of prompt files. slime_actors.data builds datasets on it; the launcher checks every prompt file
with it before any process starts (`scan_rows`) and hands the rows it checked to the buffer (`write_checked`,
`read_checked`), so a file is parsed once per job. It imports nothing of the package, so any module may use it.

    for row in read_rows("train.jsonl", max_row_bytes=4 << 20):   # Row(where, obj, problem, oversize)
        ...
    scan = scan_rows("train.jsonl", RowKeys("input", "label"), max_row_bytes, sink=writer)   # RowScan: counts
    prompt, label, metadata = check_row(obj, keys)                 # RowProblem naming what is wrong

Bounds (docs/security.md, "Inputs"): a jsonl line is read at most `max_row_bytes` (+1) at a time; a longer line is
skipped in chunks, never decoded, and counted as `oversize` (with its line number) -- a 50 MB row costs no more memory
than a short one. A parquet file is read in batches of `PARQUET_BATCH_ROWS` rows; a row whose cells hold more than
`max_row_bytes` bytes is counted as oversize before it becomes Python objects. Bytes that are not UTF-8 are a problem
of their row (file:line), as is invalid JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .json_files import not_regular, parse_json

__all__ = ["DataError", "RowProblem", "Row", "RowKeys", "RowScan", "read_rows", "check_row", "scan_rows",
           "write_checked", "read_checked", "DEFAULT_MAX_ROW_BYTES"]

DEFAULT_MAX_ROW_BYTES = 4 << 20     # --prompt-data-max-row-bytes: a row (a jsonl line) this large is skipped
PARQUET_BATCH_ROWS = 256
_CHUNK = 1 << 20                    # how much of an oversize line is read at a time while skipping it
FIRST_SHOWN = 10                    # row numbers a message lists before "... and N more"


class DataError(ValueError):
    """A problem with prompt data; `path`, `line` (jsonl, 1-based) / `row` (parquet, 0-based) and `problem`."""

    def __init__(self, problem: str, path: str | None = None, line: int | None = None, row: int | None = None):
        self.problem, self.path, self.line, self.row = problem, path, line, row
        super().__init__(f"{_loc(path, line, row)}: {problem}" if path else problem)


class RowProblem(ValueError):
    """What is wrong with one row (the caller adds where it is)."""


class Row(NamedTuple):
    where: dict[str, int]           # {"line": n} (jsonl, 1-based) or {"row": n} (parquet, 0-based)
    obj: dict | None                # the decoded row; None when `problem` says why it could not be read
    problem: str | None
    oversize: bool = False          # larger than max_row_bytes: skipped without decoding (not an error)


def _loc(path, line=None, row=None) -> str:
    if line is not None:
        return f"{path}:{line}"
    if row is not None:
        return f"{path} row {row}"
    return str(path)


def where_text(path: str, where: dict[str, int]) -> str:
    return _loc(path, **where)


def read_rows(path: str | os.PathLike, max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES) -> Iterator[Row]:
    """Yield a Row for each row of a .jsonl or .parquet file (blank jsonl lines are not rows). A file that cannot be
    opened raises DataError. `max_row_bytes` None: no bound (tests and tools only)."""
    path = os.fspath(path)
    what = not_regular(path)
    if what == "no such file":
        raise DataError("file does not exist", path)
    if what is not None:   # (a FIFO would block the reader; /dev/zero has no end)
        raise DataError(f"is {what}, expected a .jsonl or .parquet file", path)
    low = path.lower()
    if low.endswith(".jsonl"):
        return _read_jsonl(path, max_row_bytes)
    if low.endswith(".parquet"):
        return _read_parquet(path, max_row_bytes)
    raise DataError("unsupported file type (expected .jsonl or .parquet)", path)


def _read_jsonl(path: str, cap: int | None) -> Iterator[Row]:
    limit = -1 if cap is None else cap + 1
    with open(path, "rb") as f:
        lineno = 0
        while True:
            raw = f.readline(limit)
            if not raw:
                return
            lineno += 1
            where = {"line": lineno}
            if cap is not None and len(raw) > cap and not raw.endswith(b"\n"):
                size = len(raw)
                while True:   # skip the rest of the line without keeping it
                    more = f.readline(_CHUNK)
                    size += len(more)
                    if not more or more.endswith(b"\n"):
                        break
                yield Row(where, None, f"{size} bytes, more than the {cap} a row may have "
                                       "(--prompt-data-max-row-bytes): skipped unread", oversize=True)
                continue
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield Row(where, None, f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            try:
                obj = parse_json(text)
            except json.JSONDecodeError as exc:
                yield Row(where, None, f"invalid JSON ({exc.msg} at column {exc.colno})")
                continue
            if not isinstance(obj, dict):
                yield Row(where, None, f"expected a JSON object, got {_tname(obj)}")
                continue
            yield Row(where, obj, None)


def _row_sizes(batch) -> list[int]:
    """Bytes each row of a record batch holds in its variable-length cells (strings, binaries, lists of them)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    sizes = [0] * batch.num_rows
    for col in batch.columns:
        t = col.type
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
                or pa.types.is_large_binary(t):
            lens = pc.binary_length(col).fill_null(0).to_pylist()
        else:   # nested (chat messages, metadata structs): the row's slice of the column's buffers
            lens = [col.slice(i, 1).nbytes for i in range(batch.num_rows)]
        sizes = [a + int(b or 0) for a, b in zip(sizes, lens)]
    return sizes


def _read_parquet(path: str, cap: int | None) -> Iterator[Row]:
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
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            sizes = _row_sizes(batch) if cap is not None else [0] * batch.num_rows
            whole = batch.to_pylist() if cap is None or max(sizes, default=0) <= cap else None
            for i, size in enumerate(sizes):
                where = {"row": row}
                row += 1
                if cap is not None and size > cap:
                    yield Row(where, None, f"{size} bytes, more than the {cap} a row may have "
                                           "(--prompt-data-max-row-bytes): skipped unread", oversize=True)
                    continue
                yield Row(where, whole[i] if whole is not None else batch.slice(i, 1).to_pylist()[0], None)
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"cannot read parquet file after {row} rows: {type(exc).__name__}: {exc}", path,
                        row=row) from exc


def _tname(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(v), type(v).__name__)


# ---------------------------------------------------------------------------------------------------------------
# what a row must hold

@dataclass(frozen=True)
class RowKeys:
    """Where a row keeps its parts (--input-key, --label-key, --metadata-key, --tool-key)."""
    input_key: str = "input"
    label_key: str | None = None
    metadata_key: str | None = "metadata"
    tool_key: str | None = None

    def as_dict(self) -> dict:
        return {"input_key": self.input_key, "label_key": self.label_key, "metadata_key": self.metadata_key,
                "tool_key": self.tool_key}


def check_row(obj: dict, keys: RowKeys) -> tuple[Any, Any, dict]:
    """(prompt, label, metadata) of a decoded row, or RowProblem. The prompt is a non-empty string or a non-empty
    list of chat messages; the label is required when `keys.label_key` is set; metadata is an object (or a JSON
    string of one); tools, when present, a list (or a JSON string of one), kept in metadata["tools"]."""
    key = keys.input_key
    if key not in obj:
        names = ", ".join(repr(k) for k in list(obj)[:10])
        raise RowProblem(f"missing input key {key!r} (row has {names or 'no keys'})")
    prompt = obj[key]
    if isinstance(prompt, str):
        if not prompt.strip():
            raise RowProblem(f"empty prompt in {key!r}")
    elif isinstance(prompt, (list, tuple)):
        prompt = _check_messages(list(prompt), key)
    else:
        raise RowProblem(f"{key!r} must be a string or a list of chat messages, got {_tname(prompt)}")

    label = None
    if keys.label_key is not None:
        if keys.label_key not in obj:
            raise RowProblem(f"missing label key {keys.label_key!r}")
        label = obj[keys.label_key]

    metadata: dict = {}
    if keys.metadata_key is not None and obj.get(keys.metadata_key) is not None:
        m = obj[keys.metadata_key]
        if isinstance(m, str):
            try:
                m = parse_json(m) if m.strip() else {}
            except json.JSONDecodeError as exc:
                raise RowProblem(f"metadata {keys.metadata_key!r} is a string but not JSON ({exc.msg})") from None
        if not isinstance(m, dict):
            raise RowProblem(f"metadata {keys.metadata_key!r} must be an object, got {_tname(m)}")
        metadata = m

    if keys.tool_key is not None and obj.get(keys.tool_key) is not None:
        tools = obj[keys.tool_key]
        if isinstance(tools, str):
            try:
                tools = parse_json(tools)
            except json.JSONDecodeError as exc:
                raise RowProblem(f"tools {keys.tool_key!r} is a string but not JSON ({exc.msg})") from None
        if not isinstance(tools, list):
            raise RowProblem(f"tools {keys.tool_key!r} must be a list, got {_tname(tools)}")
        metadata["tools"] = tools
    return prompt, label, metadata


def _check_messages(messages: list, key: str) -> list:
    if not messages:
        raise RowProblem(f"empty prompt in {key!r} (no messages)")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RowProblem(f"{key!r} message {i} must be an object with 'role' and 'content', got {_tname(m)}")
        if not isinstance(m.get("role"), str) or not m["role"]:
            raise RowProblem(f"{key!r} message {i} has no 'role' string")
        if "content" not in m:
            raise RowProblem(f"{key!r} message {i} has no 'content'")
        if m["content"] is not None and not isinstance(m["content"], (str, list)):
            raise RowProblem(f"{key!r} message {i} content must be a string or a list, got {_tname(m['content'])}")
    if all(isinstance(m["content"], str) and not m["content"].strip() for m in messages):
        raise RowProblem(f"empty prompt in {key!r} (all messages are empty)")
    return messages


# ---------------------------------------------------------------------------------------------------------------
# one pass over a file: every problem counted, the first ones kept with where they are

@dataclass
class RowScan:
    """What one pass over a prompt file found."""
    path: str
    rows: int = 0                                        # rows read (blank jsonl lines are not rows)
    good: int = 0                                        # rows that hold a usable prompt
    problems: list[str] = field(default_factory=list)    # the first FIRST_SHOWN malformed rows: "file:line: why"
    bad: int = 0                                         # malformed rows in all
    oversize: list[str] = field(default_factory=list)    # where the first FIRST_SHOWN oversize rows are
    n_oversize: int = 0
    max_prompt_bytes: int = 0                            # the longest good prompt's text, UTF-8 bytes (text_bytes)

    def oversize_note(self, cap: int) -> str | None:
        if not self.n_oversize:
            return None
        return (f"{self.path}: {self.n_oversize} row(s) of more than {cap} bytes skipped unread "
                f"(--prompt-data-max-row-bytes): {first_places(self.oversize, self.n_oversize)}")

    def error_lines(self) -> list[str]:
        out = list(self.problems)
        if self.bad > len(self.problems):
            out.append(f"{self.path}: ... and {self.bad - len(self.problems)} more malformed row(s) "
                       f"({self.bad} of {self.rows})")
        return out


def text_bytes(value: Any) -> int:
    """The UTF-8 bytes of every string in a prompt (a string, or chat messages: their roles and contents, parts
    included) -- a bound on its tokens for byte-level BPE tokenizers (Qwen, Llama 3, DeepSeek, SmolLM2: a token is
    at least one byte of the text), before a chat template adds its own."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, dict):
        return sum(text_bytes(v) for v in value.values())
    if isinstance(value, list):
        return sum(text_bytes(v) for v in value)
    return 0


def first_places(places: list[str], total: int) -> str:
    """"a:3, a:9, a:12" (+ "... and N more")."""
    more = f" ... and {total - len(places)} more" if total > len(places) else ""
    return ", ".join(places) + more


def scan_rows(path: str, keys: RowKeys, max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES,
              sink: Callable[[dict, Any, Any, dict], None] | None = None) -> RowScan:
    """Read every row once, check it (`check_row`), count what is wrong; each good row goes to `sink(where,
    prompt, label, metadata)` (`where`: Row.where). Holds no row longer than it takes to check it. DataError for a
    file that cannot be read at all."""
    scan = RowScan(path)
    for row in read_rows(path, max_row_bytes):
        place = where_text(path, row.where)
        if row.oversize:
            scan.n_oversize += 1
            if len(scan.oversize) < FIRST_SHOWN:
                scan.oversize.append(place)
            continue
        scan.rows += 1
        problem = row.problem
        if problem is None:
            try:
                prompt, label, metadata = check_row(row.obj, keys)
            except RowProblem as exc:
                problem = str(exc)
            else:
                scan.good += 1
                scan.max_prompt_bytes = max(scan.max_prompt_bytes, text_bytes(prompt))
                if sink is not None:
                    sink(row.where, prompt, label, metadata)
                continue
        scan.bad += 1
        if len(scan.problems) < FIRST_SHOWN:
            scan.problems.append(f"{place}: {problem}")
    return scan


# ---------------------------------------------------------------------------------------------------------------
# the checked rows of a file, as the launcher hands them to the buffer: msgpack, a header, then one row per item

CHECKED_FORMAT = "slime-actors checked prompts 1"


def source_stamp(path: str, keys: RowKeys, max_row_bytes: int | None) -> dict:
    """What a checked file must match to stand for `path`: the file's size and time, the keys, the bound."""
    st = os.stat(path)
    return {"format": CHECKED_FORMAT, "source": os.path.abspath(path), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "keys": keys.as_dict(), "max_row_bytes": max_row_bytes}


class CheckedWriter:
    """Writes the rows `scan_rows` passes as its sink to `path` (a temporary name until `close`)."""

    def __init__(self, path: str, stamp: dict):
        import msgpack
        self.path, self._tmp = path, f"{path}.{os.getpid()}.tmp"
        self._packer = msgpack.Packer(use_bin_type=True)
        self._f = open(self._tmp, "wb")
        self._f.write(self._packer.pack(stamp))

    def __call__(self, where: dict, prompt: Any, label: Any, metadata: dict) -> None:
        self._f.write(self._packer.pack([where, prompt, label, metadata]))

    def close(self, keep: bool = True) -> None:
        self._f.close()
        if keep:
            os.replace(self._tmp, self.path)
        else:
            os.unlink(self._tmp)


def write_checked(path: str, stamp: dict) -> CheckedWriter:
    return CheckedWriter(path, stamp)


def read_checked(checked: str, stamp: dict) -> Iterator[tuple[dict, Any, Any, dict]] | None:
    """The rows of a checked file when it stands for the source `stamp` describes (else None: read the source)."""
    import msgpack
    try:
        f = open(checked, "rb")
    except OSError:
        return None
    unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False, max_buffer_size=0)
    try:
        header = next(unpacker)
    except Exception:
        f.close()
        return None
    if header != stamp:
        f.close()
        return None

    def rows():
        with f:
            for item in unpacker:
                where, prompt, label, metadata = item
                yield where, prompt, label, metadata
    return rows()
