"""Reading trace files back (docs/trace-format.md).

    run = TraceRun("runs/x")             # every *.trace under runs/x/traces (or the folder itself)
    for ev in run.events():              # all records of all actors, by time
        print(ev.actor, ev.ev, ev.method, ev.id)
    run.messages()                       # one Message per id: send/recv/handled joined across files

A file that is not a trace, of another format version, or cut short is reported with its path, the byte offset and
what was expected (TraceFormatError); a file cut short at the end (a killed process) yields what it holds and notes
the truncation in `run.problems`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import msgpack

from .writer import TRACE_FORMAT, TRACE_VERSION

SUPPORTED = (1,)


class TraceFormatError(ValueError):
    def __init__(self, path, offset: int, message: str):
        self.path, self.offset = str(path), offset
        super().__init__(f"{path}: at byte {offset}: {message}")


@dataclass
class Event:
    actor: str            # the actor whose file holds the record
    ev: str               # send | recv | handled | drop | input
    t_ns: int
    header: dict | None   # decoded envelope header (None for drop/input)
    body_raw: bytes | None
    body_size: int
    body_hash: str | None
    arrays: list | None
    extra: dict | None
    file: str = ""
    offset: int = 0

    @property
    def id(self) -> str | None:
        return self.header.get("id") if self.header else None

    @property
    def method(self) -> str | None:
        return self.header.get("method") if self.header else None

    @property
    def kind(self) -> str | None:
        return self.header.get("kind") if self.header else None

    def body(self) -> Any:
        """The decoded body; arrays appear as {'__array__': dtype, 'shape': ..., 'hash': ...} (or their data)."""
        if self.body_raw is None:
            if self.body_size:
                return {"__omitted__": True, "size": self.body_size, "hash": self.body_hash}
            return None
        return decode_recorded_body(self.body_raw, self.arrays)


def decode_recorded_body(raw: bytes, arrays: list | None) -> Any:
    from ..mailbox.codec import ARRAY_EXT, _make_array  # noqa: PLC0415

    def hook(code, payload):
        if code != ARRAY_EXT:
            return msgpack.ExtType(code, payload)
        index, dtype, shape, kind = msgpack.unpackb(payload)
        rec = arrays[index] if arrays and index < len(arrays) else None
        if rec is not None and rec[5] is not None:
            return _make_array(rec[5], dtype, tuple(shape), kind)
        return {"__array__": dtype, "shape": shape, "kind": kind, "hash": rec[4] if rec else None}

    return msgpack.unpackb(raw, ext_hook=hook, raw=False, strict_map_key=False)


@dataclass
class TraceFile:
    path: Path
    meta: dict
    events: list[Event]
    truncated: bool = False


def read_file(path: str | os.PathLike) -> TraceFile:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceFormatError(path, 0, "file does not exist") from None
    if not data:
        raise TraceFormatError(path, 0, "file is empty: expected a trace header map")
    up = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1 << 20))
    up.feed(data)
    try:
        meta = up.unpack()
    except Exception as exc:
        raise TraceFormatError(path, 0, f"expected a trace header map, could not decode: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != TRACE_FORMAT:
        raise TraceFormatError(path, 0, f"not a slime-actors trace (expected a map with format={TRACE_FORMAT!r})")
    if meta.get("version") not in SUPPORTED:
        raise TraceFormatError(path, 0, f"trace format version {meta.get('version')!r} is not supported by this "
                                        f"reader (supported: {list(SUPPORTED)}; written by version {TRACE_VERSION})")
    actor = meta.get("actor", "?")
    events: list[Event] = []
    truncated = False
    while True:
        offset = up.tell()
        if offset >= len(data):
            break
        try:
            rec = up.unpack()
        except msgpack.OutOfData:
            truncated = True  # the process died mid-write: keep what came before
            break
        except Exception as exc:
            raise TraceFormatError(path, offset, f"expected a trace record, could not decode: {exc}") from None
        if not isinstance(rec, list) or len(rec) != 8 or not isinstance(rec[0], str) or not isinstance(rec[1], int):
            raise TraceFormatError(path, offset, "expected a record [event, time_ns, header, body, body_size, "
                                                 f"body_hash, arrays, extra], got {str(rec)[:120]}")
        ev, t, hraw, body, size, bhash, arrays, extra = rec
        header = None
        if hraw is not None:
            try:
                header = msgpack.unpackb(hraw, raw=False, strict_map_key=False)
            except Exception as exc:
                raise TraceFormatError(path, offset, f"record header is not msgpack: {exc}") from None
            if not isinstance(header, dict):
                header = {"invalid": str(header)[:200]}
        events.append(Event(actor, ev, t, header, body, size, bhash, arrays, extra, str(path), offset))
    return TraceFile(path, meta, events, truncated)


@dataclass
class Message:
    """One message id joined across the sender's and receiver's files."""

    id: str
    header: dict
    send: Event | None = None
    recv: Event | None = None
    handled: Event | None = None
    reply: Event | None = None       # the reply/error as received back by the asker
    reply_sent: Event | None = None  # the reply as sent by the handler's side

    @property
    def method(self) -> str:
        return self.header.get("method", "")

    @property
    def rtt_ns(self) -> int | None:
        if self.send is not None and self.reply is not None:
            return self.reply.t_ns - self.send.t_ns
        return None

    @property
    def handle_ns(self) -> int | None:
        if self.handled is not None and self.handled.extra:
            return self.handled.extra.get("dur_ns")
        return None


@dataclass
class TraceRun:
    root: Path
    files: list[TraceFile] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        d = self.root / "traces" if (self.root / "traces").is_dir() else self.root
        if not d.exists():
            raise TraceFormatError(self.root, 0, "no such run directory")
        paths = sorted(d.glob("*.trace"))
        if not paths:
            raise TraceFormatError(d, 0, "no *.trace files here: is this a run directory?")
        self.files, self.problems = [], []
        for p in paths:
            tf = read_file(p)
            if tf.truncated:
                self.problems.append(f"{p}: ends mid-record (the process was killed); read what came before")
            self.files.append(tf)

    def actors(self) -> list[str]:
        return sorted({f.meta.get("actor", "?") for f in self.files})

    def events(self, actor: str | None = None) -> Iterator[Event]:
        evs = [e for f in self.files for e in f.events if actor is None or e.actor == actor]
        evs.sort(key=lambda e: e.t_ns)
        return iter(evs)

    def messages(self) -> dict[str, Message]:
        out: dict[str, Message] = {}
        replies: list[Event] = []
        for f in self.files:
            for e in f.events:
                h = e.header
                if h is None:
                    continue
                if h.get("kind") in ("reply", "error"):
                    replies.append(e)
                    continue
                m = out.get(h["id"])
                if m is None:
                    m = out[h["id"]] = Message(h["id"], h)
                if e.ev == "send":
                    m.send = e
                elif e.ev == "recv":
                    m.recv = e
                elif e.ev == "handled":
                    m.handled = e
        for e in replies:
            m = out.get(e.header.get("re", ""))
            if m is None:
                continue
            if e.ev == "recv":
                m.reply = e
            elif e.ev == "send":
                m.reply_sent = e
        return out

    def meta(self, actor: str) -> dict:
        for f in self.files:
            if f.meta.get("actor") == actor:
                return f.meta
        raise KeyError(f"no trace file for actor {actor!r} in {self.root} (actors: {', '.join(self.actors())})")
