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
from typing import Any, Iterator, NamedTuple

import msgpack

from ..mailbox.codec import header_as_dict
from .writer import TRACE_FORMAT, TRACE_VERSION

SUPPORTED = (1, 2, 3, 4, 5, 6)  # docs/trace-format.md: what changed from one version to the next


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

    @property
    def name(self) -> str | None:
        """An input record's name (record_input), else None."""
        return self.extra.get("name") if self.ev == "input" and isinstance(self.extra, dict) else None

    @property
    def omitted(self) -> bool:
        """True when the body was over the writer's limit and only its size and checksum were kept."""
        return self.body_raw is None and bool(self.body_size)

    def body(self) -> Any:
        """The decoded body; arrays appear as {'__array__': dtype, 'shape': ..., 'hash': ...} (or their data).

        A body that does not decode raises TraceFormatError naming the file and the record's offset."""
        if self.body_raw is None:
            if self.body_size:
                return {"__omitted__": True, "size": self.body_size, "hash": self.body_hash}
            return None
        try:
            return decode_recorded_body(self.body_raw, self.arrays)
        except Exception as exc:
            raise TraceFormatError(self.file or "?", self.offset,
                                   f"expected a msgpack body in this {self.ev} record, could not decode: "
                                   f"{type(exc).__name__}: {exc}") from None


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


class Step(NamedTuple):
    """One step of one of the actor's tasks (version 5): which task, when it began, and the external call it resumed
    from (a `resume` record: "ask", "recorded_async" ...; None for a `step`). `offset` orders it among the file's
    events."""

    offset: int
    t_ns: int
    task: str
    resume: str | None


@dataclass
class TraceFile:
    path: Path
    meta: dict
    events: list[Event]
    truncated: bool = False
    truncated_at: int = 0
    schedule: list[Step] = field(default_factory=list)  # the actor's schedule, in file order (version 5)
    end: dict | None = None  # the `end` record's extra (version 6): the writer closed the file; None: cut short

    @property
    def segment(self) -> int:
        """Which file of its process this is: 0, or k >= 1 for the k-th after a rotation (version 6)."""
        s = self.meta.get("segment", 0)
        return s if type(s) is int and s >= 0 else 0

    @property
    def rotated(self) -> bool:
        """The writer went on in the next segment (--trace-max-bytes)."""
        return self.end is not None and "rotated" in self.end

    @property
    def complete(self) -> bool | None:
        """True: it ends where the actor stopped (an `end` record, not a rotation); False: it was cut short -- its
        process killed (no `end` record) or rotated into a next segment; None: a file written before version 6,
        which cannot tell (replay then looks for the actor's stop in its schedule)."""
        if self.end is not None:
            return not self.rotated
        version = self.meta.get("version")
        return False if type(version) is int and version >= 6 else None


def read_file(path: str | os.PathLike) -> TraceFile:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceFormatError(path, 0, "file does not exist") from None
    if path.suffix == ".gz":  # an archived trace (NAME.trace.gz): offsets below are in the decompressed stream
        import gzip
        import zlib
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(path, 0, f"expected a gzip-compressed trace file, could not decompress: "
                                            f"{exc}") from None
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
    version = meta.get("version")
    if type(version) is not int or version not in SUPPORTED:
        hint = ""
        if type(version) is int:
            hint = (" (written by a newer slime-actors: upgrade to read it)" if version > max(SUPPORTED)
                    else " (written by an older slime-actors, before trace files were versioned as they are now)")
        raise TraceFormatError(path, 0, f"trace format version {version!r} is not supported by this reader{hint}; "
                                        f"it reads versions {list(SUPPORTED)} and writes version {TRACE_VERSION} "
                                        "(docs/trace-format.md)")
    actor = meta.get("actor", "?")
    events: list[Event] = []
    schedule: list[Step] = []
    end = None
    truncated = False
    offset = 0
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
        if (not isinstance(rec, list) or len(rec) not in (8, 9) or not isinstance(rec[0], str)
                or not isinstance(rec[1], int)):
            raise TraceFormatError(path, offset, "expected a record [event, time_ns, header, body, body_size, "
                                                 "body_hash, arrays, extra] (a recv may add dur_ns), "
                                                 f"got {str(rec)[:120]}")
        ev, t, hraw, body, size, bhash, arrays, extra = rec[:8]
        if ev == END:  # version 6: the writer closed the file (the last record)
            if len(rec) != 8 or hraw is not None or body is not None or not isinstance(extra, (dict, type(None))):
                raise TraceFormatError(path, offset, "expected an end record [end, time_ns, nil, nil, 0, nil, nil, "
                                                     f"extra map], got {str(rec)[:120]}")
            end = dict(extra or {})
            end["t_ns"] = t
            continue
        if ev in SCHEDULE_EVENTS:  # the actor's schedule: [event, t, call name or b"", task name, size, nil...]
            if len(rec) != 8 or not isinstance(hraw, bytes) or not isinstance(body, bytes) or \
                    (ev == "step") != (hraw == b""):
                what = "an empty header" if ev == "step" else "the call's name as the header"
                raise TraceFormatError(path, offset, f"expected a {ev} record [{ev}, time_ns, header, task name, size, "
                                                     f"nil, nil, nil] with {what}, got {str(rec)[:120]}")
            schedule.append(Step(offset, t, body.decode("utf-8", "replace"),
                                 hraw.decode("utf-8", "replace") if ev == "resume" else None))
            continue
        problem = _check_record(ev, hraw, body, size, arrays, extra) or (_check_outcome(ev, extra, rec[8])
                                                                         if len(rec) == 9 else None)
        if problem:
            raise TraceFormatError(path, offset, problem)
        header = None
        if hraw is not None:
            try:
                header = header_as_dict(msgpack.unpackb(hraw, raw=False, strict_map_key=False))
            except Exception as exc:
                raise TraceFormatError(path, offset, f"record header is not msgpack: {exc}") from None
            # an envelope of either protocol version (docs/wire-format.md): version 2's array is read as a map
            if not isinstance(header, dict) or not all(isinstance(header.get(k), str) for k in _HEADER_KEYS):
                raise TraceFormatError(path, offset, "expected a message header (a version 2 array or a version 1 "
                                                     f"map) with string fields {', '.join(_HEADER_KEYS)}, got "
                                                     f"{str(header)[:120]}")
        # a request handled synchronously: one record carries its arrival and its outcome (see the writer)
        handled = None
        if len(rec) == 9:  # version 4: its handler returned dur_ns after the arrival
            handled, th = {"outcome": "ok", "dur_ns": rec[8]}, t + rec[8]
        elif ev == "recv" and extra and ("handled" in extra or "ok" in extra):
            if "ok" in extra:  # version 3's short form of a handler that returned
                th, dur = extra["ok"]
                handled = {"outcome": "ok", "dur_ns": dur}
            else:
                handled = dict(extra["handled"])
                th = handled.pop("t", t)
            extra = {k: v for k, v in extra.items() if k not in ("handled", "ok")} or None
        if handled is not None:
            events.append(Event(actor, "recv", t, header, body, size, bhash, arrays, extra, str(path), offset))
            events.append(Event(actor, "handled", th, header, None, 0, None, None, handled, str(path), offset))
            continue
        events.append(Event(actor, ev, t, header, body, size, bhash, arrays, extra, str(path), offset))
    return TraceFile(path, meta, events, truncated, offset if truncated else 0, schedule, end)


EVENTS = ("send", "recv", "handled", "drop", "input")


def recorded_environment(tf: TraceFile) -> dict | None:
    """What decided the floats of the actor's computation (slime_actors/traces/environment.py): the header's
    `environment`, with what torch decided (the input `environment`, recorded by an actor that computes with torch)
    under "torch"; None for a recording made before environments were recorded."""
    env = tf.meta.get("environment")
    if not isinstance(env, dict):
        return None
    env = dict(env)
    for e in tf.events:
        if e.ev == "input" and e.name == "environment":
            try:
                value = e.body()
            except TraceFormatError:
                break
            if isinstance(value, dict):
                env["torch"] = value
            break
    return env
SCHEDULE_EVENTS = ("step", "resume")  # kept apart from the events: TraceFile.schedule
END = "end"  # version 6: the last record of a file its writer closed (TraceFile.end)
_HEADER_KEYS = ("id", "kind", "from", "to", "method")


def _check_record(ev, hraw, body, size, arrays, extra) -> str | None:
    """What is wrong with a decoded record's fields (None if nothing): a corrupt file can still be valid msgpack."""
    if ev not in EVENTS:
        return f"expected an event name ({', '.join(EVENTS)}), got {str(ev)[:40]!r}"
    if hraw is not None and not isinstance(hraw, bytes):
        return f"expected the header as bytes or nil, got {type(hraw).__name__}"
    if hraw is None and ev in ("send", "recv", "handled"):
        return f"a {ev} record must carry the message header"
    if body is not None and not isinstance(body, bytes):
        return f"expected the body as bytes or nil, got {type(body).__name__}"
    if not isinstance(size, int) or size < 0:
        return f"expected the body size as an int >= 0, got {size!r:.40}"
    if arrays is not None and not (isinstance(arrays, list) and all(isinstance(a, list) and len(a) == 6
                                                                    for a in arrays)):
        return "expected arrays as nil or a list of [dtype, shape, kind, nbytes, checksum, data]"
    if extra is not None and not isinstance(extra, dict):
        return f"expected extra as a map or nil, got {type(extra).__name__}"
    if ev == "recv" and extra and "handled" in extra and not isinstance(extra["handled"], dict):
        return f"expected extra.handled (the request's outcome) as a map, got {type(extra['handled']).__name__}"
    if ev == "recv" and extra and "ok" in extra:
        ok = extra["ok"]
        if not (isinstance(ok, list) and len(ok) == 2 and all(type(x) is int for x in ok)):
            return f"expected extra.ok (when the handler returned, how long it ran) as [t_ns, dur_ns], got {ok!r:.80}"
        if "handled" in extra:
            return "a recv record carries its outcome once: extra has both 'ok' and 'handled'"
    return None


def _check_outcome(ev, extra, dur) -> str | None:
    """What is wrong with a version-4 record's outcome field dur_ns (None if nothing)."""
    if ev != "recv":
        return f"only a recv record carries an outcome (dur_ns), this is a {str(ev)[:40]!r}"
    if type(dur) is not int or dur < 0:
        return f"expected the outcome field dur_ns as an int >= 0, got {dur!r:.80}"
    if extra and ("ok" in extra or "handled" in extra):
        return "a recv record carries its outcome once: it has dur_ns and extra." + \
            ("ok" if "ok" in extra else "handled")
    return None


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

    def __init__(self, root: str | os.PathLike, *, skip_bad: bool = False):
        """Read every trace file of a run. A bad file raises TraceFormatError, or with `skip_bad` is left out and
        named in `problems` (the run must still hold at least one good file)."""
        self.root = Path(root)
        if self.root.is_file():
            paths = [self.root]
        else:
            d = self.root / "traces" if (self.root / "traces").is_dir() else self.root
            if not d.exists():
                raise TraceFormatError(self.root, 0, "no such run directory")
            paths = sorted([*d.glob("*.trace"), *d.glob("*.trace.gz")])
            if not paths:
                raise TraceFormatError(d, 0, "no *.trace (or *.trace.gz) files here: is this a run directory?")
        self.files, self.problems = [], []
        for p in paths:
            try:
                tf = read_file(p)
            except TraceFormatError as exc:
                if not skip_bad:
                    raise
                self.problems.append(f"skipped: {exc}")
                continue
            if tf.truncated:
                self.problems.append(f"{p}: at byte {tf.truncated_at}: ends mid-record (the process was killed?); "
                                     "read what came before")
            self.files.append(tf)
        if not self.files:
            raise TraceFormatError(self.root, 0, "no readable trace file: " + "; ".join(self.problems))
        # a process's files in the order written: its first, then the segments after rotations
        self.files.sort(key=lambda f: (str(f.meta.get("actor", "?")), _int(f.meta.get("started_ns")),
                                       _int(f.meta.get("pid")), f.segment))
        self._gaps()

    def _gaps(self) -> None:
        """Note the segments a rotation deleted (--trace-max-bytes): what lies between the kept files is gone."""
        by_proc: dict[tuple, list[int]] = {}
        for f in self.files:
            by_proc.setdefault((f.meta.get("actor"), f.meta.get("pid"), f.meta.get("started_ns")), []).append(
                f.segment)
        for (actor, pid, _), segs in by_proc.items():
            missing = sorted(set(range(max(segs) + 1)) - set(segs))
            if missing:
                self.problems.append(f"{actor} (pid {pid}): trace segment(s) {_ranges(missing)} were deleted by "
                                     "rotation (--trace-max-bytes); what they held is not here")

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


def _int(v) -> int:
    return v if type(v) is int else 0


def _ranges(xs: list[int]) -> str:
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out)
