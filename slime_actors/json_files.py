"""JSON files read from disk that this process did not just write -- a checkpoint's meta.json, a model's config.json,
an adapter's adapter_config.json, a run directory's head.json, status.json and start-up reports (a run directory
is copied between machines and people): hostile until checked. One reader bounds what it reads, never blocks on
something that is not a regular file, and says what is wrong with the file.

    meta = read_json_object(path)            # a dict, or JsonFileError naming the file and what is wrong with it
    status = read_small_json(path)           # a dict, or None: missing, unreadable, too large, not JSON, not an object
    obj = parse_json(line)                   # json.loads for text we did not write (a prompt file's line, a label)

Python's json reads a file whole and builds it whole: a multi-GB "meta.json" (or one JSON number of a billion
digits) would take the process's memory before anything looked at it, and a file nested 100,000 deep raises
RecursionError rather than ValueError. Both are stopped here; `parse_json` stops the second for JSON text read
elsewhere (a prompt file's lines, a corpus's, a label, a request's body, a server's answer).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_BYTES = 8 << 20   # the largest such file a job writes is a checkpoint's meta.json: ~7 KB + ~70 bytes an evaluation
DEEP = "nested too deep to be read"


class JsonFileError(ValueError):
    """A JSON file that cannot be used; the message names the file and the problem."""


def parse_json(data: str | bytes | bytearray) -> Any:
    """json.loads for text we did not write: JSON nested deeper than Python's parser goes raises json.JSONDecodeError
    (DEEP; a ValueError) like any other text that is not JSON, not RecursionError -- which
    `except ValueError` misses, and which a caller's `except RuntimeError` takes for something else."""
    try:
        return json.loads(data)
    except RecursionError:
        raise json.JSONDecodeError(DEEP, data if isinstance(data, str) else "", 0) from None


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_regular(path: str | os.PathLike) -> str | None:
    """None when `path` is a regular file (through links); else what it is -- "no such file", "a directory", "a FIFO
    (named pipe)", "a character device", "unreadable (Permission denied)", ... -- for an error naming the flag and
    the path ("PATH is WHAT"). Any file a user names is checked so before it is opened: opening a FIFO blocks until
    something writes to it, /dev/zero never ends."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "a special file")


def odd_files(base: str | os.PathLike, names: list[str]) -> str | None:
    """"NAME is WHAT; ..." for the files `names` under `base` that are not regular files (the first five, sorted, and
    how many more), or None when every one is."""
    odd = []
    for name in sorted(names):
        what = not_regular(os.path.join(base, name))
        if what:
            odd.append(f"{name} is {'a link to nothing' if what == 'no such file' else what}")
    if not odd:
        return None
    return "; ".join(odd[:5]) + (f" (and {len(odd) - 5} more)" if len(odd) > 5 else "")


def read_json_object(path: str | os.PathLike, limit: int = MAX_BYTES) -> dict[str, Any]:
    """The JSON object in `path`, at most `limit` bytes. JsonFileError when the file is missing, not a regular file,
    unreadable, larger, not UTF-8 JSON, nested too deep, or holds something other than an object."""
    p = Path(path)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):     # (a FIFO would block the open; a device could be endless)
            raise JsonFileError(f"{p}: not a regular file")
        if st.st_size > limit:
            raise JsonFileError(f"{p}: {st.st_size:,} bytes, more than the {limit:,} such a file may have")
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise JsonFileError(f"{p}: no such file") from None
    except OSError as exc:
        raise JsonFileError(f"{p}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:                    # (it grew since the stat)
        raise JsonFileError(f"{p}: more than the {limit:,} bytes such a file may have")
    try:
        obj = parse_json(data)
    except json.JSONDecodeError as exc:
        raise JsonFileError(f"{p}: {DEEP}" if exc.msg == DEEP else f"{p}: not valid JSON ({exc})") from None
    except ValueError as exc:                # (UnicodeDecodeError)
        raise JsonFileError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise JsonFileError(f"{p}: holds a JSON {_kind(obj)} where an object ({{...}}) belongs")
    return obj


def read_small_json(path: str | os.PathLike, limit: int = MAX_BYTES) -> dict[str, Any] | None:
    """`read_json_object`, None instead of the error: for files whose absence or damage means "nothing known" (another
    job's status, a report not written yet)."""
    try:
        return read_json_object(path, limit)
    except JsonFileError:
        return None


def _kind(obj: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(obj), "number")
