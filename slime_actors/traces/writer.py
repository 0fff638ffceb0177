"""Per-process trace files, written off the hot path (docs/trace-format.md).

The mailbox records every message it sends, receives and finishes handling, and a writer thread appends the records
to RUN_DIR/traces/<role>-<index>.<pid>.trace every `flush_interval` seconds. Header and body bytes are the ones that
went over the wire, so recording re-encodes nothing. Two ways in:

* the hot path (the event loop's thread: mailbox and actor dispatch): the common record -- header and body bytes
  within the limit, no arrays -- is packed at once onto the end of the queue's buffer, `rec(...)`, one C call
  (`_fastrec.Recorder`: no object per record); another whose parts are all bytes, ints and small maps is packed
  and queued as bytes, `append(pack(record))`. Packed records hold no references: a backlog of records costs the
  garbage collector nothing (queued tuples did: every collection walked them, ~1 us a message), and the writer
  thread only writes them.
* `record(...)`, from any thread, and records with arrays or bodies over `body_limit`: queued as a tuple that the
  writer thread finishes (the checksum of a body over the limit, and of an array frame whose checksum was not known
  already) and packs.

A record is the msgpack array [event, time_ns, header, body, body_size, body_hash, arrays, extra]. A request that an
actor handled synchronously is written as one `recv` record that also holds its outcome -- when the handler returned,
a ninth field, [..., extra, dur_ns] (it returned dur_ns after the request's arrival); else extra =
{"handled": {..., "t": time_ns}} -- the outcome that would otherwise be a separate `handled` record; the reader splits
it back into the two events.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import os
import socket
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import msgpack
import xxhash

from . import environment

try:  # the record queue in C (setup.py builds it; optional): the same bytes as msgpack's, ~4x faster
    from ._fastrec import Recorder as _CRecorder
except ImportError:
    _CRecorder = None

TRACE_FORMAT = "slime-actors-trace"
# 1: every request's outcome is a `handled` record of its own.
# 2: a request handled synchronously may be one `recv` record whose extra holds {"handled": {...}} (the reader splits
#    it); inputs may carry a `key`.
# 3: a returned handler's outcome in that record may be the short {"ok": [t_ns, dur_ns]}.
# 4: ... or, instead, a ninth field of the recv record: [..., extra, dur_ns], the handler having returned dur_ns after
#    the arrival (no map, no list, no clock read of its own: the cheapest record to build and pack on the loop).
# 5: the actor's schedule: a record for each step of each of its tasks, in the order the steps ran: [step, time_ns,
#    b"", task name, ...], or [resume, time_ns, the external call's name, task name, ...] for a step that began inside
#    an external call (slime_actors/actors/schedule.py).
# 6: an `end` record closes a file its writer closed ([end, time_ns, nil, nil, 0, nil, nil, {records, lost}], or
#    {rotated: next file} when the writer went on in a next segment): a file without one was cut short (its process
#    killed). Files rotate at a size bound (--trace-max-bytes): the header's `segment` numbers them.
#    Readers read every older version too (docs/trace-format.md, *Versions*).
TRACE_VERSION = 6

# events
SEND, RECV, HANDLED, DROP, INPUT = "send", "recv", "handled", "drop", "input"
STEP, RESUME = "step", "resume"  # the schedule (schedule.py)
END = "end"  # the file's last record, written by close() or a rotation (version 6)

# A process's trace is bounded by its writer's max_bytes (--trace-max-bytes) when that is > 0: the file rotates into
# segments of max_bytes / SEGMENTS bytes, of which the first (the actor's start: what replay needs) and the newest
# ones are kept, SEGMENTS in all.
SEGMENTS = 8


# The checksum of bodies over the limit and of array frames, named in each file's header ("digest"): XXH3-64,
# 16 hex digits (~15 GB/s on one core here, against ~3.3 GB/s for zlib's CRC-32 and ~0.4 GB/s for BLAKE2b). A
# mailbox checksums the arrays it sends itself and hands them over in ArrayRef.sum, and a receiver gets them from the
# sender's header (mailbox/checksums.py): here only frames that came without one are checksummed. Files written
# before the header named its "digest" hold CRC-32s (8 hex digits).
DIGEST = "xxh3_64"
DIGESTS = ("xxh3_64", "crc32")


def digest(data, algo: str = DIGEST) -> str:
    """A content checksum: it tells changed data from unchanged in a trace diff or replay; it is no defence against
    a forger. `algo` is a file's "digest" (DIGESTS): replay checks a recording with the algorithm it was made with."""
    if algo == "xxh3_64":
        return xxhash.xxh3_64_hexdigest(data)
    if algo == "crc32":
        return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"
    raise ValueError(f"unknown trace digest {algo!r} (known: {', '.join(DIGESTS)})")


def rec_py(pack, ev: str, t: int, header: bytes, body: bytes, *dur) -> bytes:
    """What `_fastrec.rec` returns, packed by msgpack: the 8-tuple record (event, t, header, body, len(body), None,
    None, None), or with a duration the 9-tuple of a recv with its handler's duration -- `None` for "from t until
    now" (0 if the clock stepped back)."""
    if not dur:
        return pack((ev, t, header, body, len(body), None, None, None))
    d = dur[0]
    if d is None:
        d = time.time_ns() - t
        d = d if d > 0 else 0
    return pack((ev, t, header, body, len(body), None, None, None, d))


class PyRecorder:
    """`_fastrec.Recorder` without the extension: a queue of items, packed records among them as bytes."""

    def __init__(self, pack):
        self._pack = pack
        self._q = collections.deque()
        self.put = self._q.append

    def rec(self, ev: str, t: int, header: bytes, body: bytes, *dur) -> None:
        self._q.append(rec_py(self._pack, ev, t, header, body, *dur))

    def take(self) -> tuple[list, int]:
        q = self._q
        n = len(q)
        # n calls of popleft, from C (items are never None); only the writer thread takes, under its lock
        return list(itertools.islice(iter(q.popleft, None), n)), n

    @property
    def pending(self) -> int:
        return len(self._q)


def trace_file_name(actor: str, pid: int | None = None, segment: int = 0) -> str:
    """<role>-<index>.<pid>.trace, and <role>-<index>.<pid>.<k>.trace for the k-th segment after a rotation."""
    seg = f".{segment}" if segment else ""
    return f"{actor.replace('/', '-')}.{pid or os.getpid()}{seg}.trace"


def segment_path(first: Path, segment: int) -> Path:
    """The path of segment `segment` of the trace whose first file is `first`."""
    if not segment:
        return first
    stem = first.name[:-len(".trace")] if first.name.endswith(".trace") else first.name
    return first.with_name(f"{stem}.{segment}.trace")


class TraceWriter:
    """Writes one actor's trace file. Thread-safe `record`; `close` flushes everything recorded so far. It is the
    mailbox's tracer (slime_actors.mailbox.tracing.HotPathTracer: `record`, and `append`/`pack`/`rec` for the event
    loop's thread)."""

    def __init__(self, path: str | os.PathLike, actor: str, *, meta: dict | None = None, body_limit: int = 65536,
                 keep_arrays: bool = False, flush_interval: float = 0.05, max_bytes: int = 0):
        self.path = Path(path)  # the first file; after a rotation, self.current is where records go
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.actor = actor
        self.body_limit = body_limit
        self.keep_arrays = keep_arrays
        self.flush_interval = flush_interval
        self.records = 0
        self.lost = 0  # records that could not be written
        # the size bound (0: none): segments of segment_bytes, the first and the newest kept (SEGMENTS in all)
        self.max_bytes = max(0, int(max_bytes))
        self.segment_bytes = max(self.max_bytes // SEGMENTS, 1 << 16) if self.max_bytes else 0
        self.segment = 0
        self.current = self.path
        self.written = 0          # bytes in the current segment
        self.total_written = 0    # bytes written over the writer's life (deleted segments included)
        self.deleted = 0          # segments a rotation deleted
        self._kept: list[Path] = [self.path]
        # The hot path's entries (the mailbox and the actor's dispatch use them; see record()), the queue's own
        # methods, and the event loop thread's own Packer (a Packer is not thread-safe: nothing else may call `pack`).
        # rec(ev, t, header, body[, dur]) queues, packed, the record of a message without arrays whose header and
        # body are bytes and whose body is within body_limit (the common case); dur None: from t until now.
        # `append` queues a record packed with `pack` -- the 8-tuple (event, time_ns, header, body, body_size, None,
        # None, extra), or the 9-tuple of a recv with its outcome, with header and body as bytes -- or, unpacked,
        # such an 8-tuple (the writer packs it) or the 7-tuple that record() queues (event, time_ns, header, body,
        # refs, buffers, extra), which the writer thread finishes (checksums of arrays and of bodies over
        # body_limit). Records are written in queue order.
        self.pack = msgpack.Packer(use_bin_type=True).pack
        self._rq = _CRecorder() if _CRecorder is not None else PyRecorder(self.pack)
        self.append = self._rq.put
        self.rec = self._rq.rec
        self._file = open(self.path, "ab", buffering=1 << 20)
        self._packer = msgpack.Packer(use_bin_type=True)  # the writer thread's (and close's, under the lock)
        self._drain_lock = threading.Lock()  # close() may drain while the thread does
        head = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "actor": actor, "pid": os.getpid(),
                "host": socket.gethostname(), "started_ns": time.time_ns(), "body_limit": body_limit,
                "keep_arrays": keep_arrays, "digest": DIGEST, "environment": environment.machine()}
        if self.max_bytes:
            head["max_bytes"] = self.max_bytes
        head.update(meta or {})
        self._head = head
        self._write_head()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"trace-writer:{actor}", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- hot path ---------------------------------------------------------------------------------------------
    def record(self, ev: str, header, body=None, refs=None, buffers=None, extra: dict | None = None) -> None:
        """Queue one record. `header`/`body` are the raw msgpack bytes (or memoryviews) of the frames."""
        self.append((ev, time.time_ns(), header, body, refs, buffers, extra))

    def record_input(self, name: str, value: Any, key: str | None = None) -> None:
        """Record a nondeterministic input (an engine's output, a clock reading) so replay can feed it back.

        `key` tells apart inputs of one name that may arrive in another order on replay (an engine's answers to
        concurrent requests): replay serves the recorded value with the same name and key. Inputs are kept in full
        whatever the body limit (replay cannot do without them): queued as a finished record."""
        body = msgpack.packb(value, use_bin_type=True, default=_plain)
        extra = {"name": name} if key is None else {"name": name, "key": key}
        self.append((INPUT, time.time_ns(), None, body, len(body), None, None, extra))  # a finished record

    # -- writer thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        # Runs in the writer thread, holding the GIL while it works: every microsecond here is taken from the event
        # loop. The common case -- everything queued was packed on the hot path -- runs no Python code per record:
        # the queue is taken in one call (a few bytes items, each many records) and written with one call (the
        # write itself lets go of the GIL). Otherwise finished 8-tuples are packed a run at a time: msgpack packs a
        # list of N records as an array header followed by the N records back to back, which is the file's layout
        # once the header is cut off.
        with self._drain_lock:  # only this thread, or close() under the lock, takes
            items, n = self._rq.take()
            if not n:
                return
            try:
                chunks = [b"".join(items)]  # all bytes (join checks each item's type, in C)
            except TypeError:  # tuples among them
                chunks, lost = [], self.lost
                self._drain_mixed(items, chunks)
                n -= self.lost - lost
            if chunks:
                try:
                    self._file.writelines(chunks)
                    self._file.flush()
                    self.records += n
                    size = sum(len(c) for c in chunks)
                    self.written += size
                    self.total_written += size
                except (OSError, ValueError):
                    self.lost += n  # disk full or closed: tracing must never take the actor down
                    return
                if self.segment_bytes and self.written >= self.segment_bytes:
                    self._rotate()

    def _write_head(self) -> None:
        data = self._packer.pack(self._head)
        self._file.write(data)
        self._file.flush()
        self.written = len(data)
        self.total_written += len(data)

    def _end_record(self, extra: dict) -> bytes:
        return self._packer.pack([END, time.time_ns(), None, None, 0, None, None, extra])

    def _rotate(self) -> None:
        """Close the current segment with an end record naming the next, go on in the next (same header, its
        `segment` number), and delete the oldest segment but the first beyond SEGMENTS kept. Writer thread (or
        close), under the drain lock."""
        nxt = segment_path(self.path, self.segment + 1)
        try:
            self._file.write(self._end_record({"rotated": nxt.name, "records": self.records}))
            self._file.close()
            self._file = open(nxt, "ab", buffering=1 << 20)
        except OSError:
            self.segment_bytes = 0  # cannot rotate (disk full?): stop trying; records are counted as lost
            return
        self.segment += 1
        self.current = nxt
        self._head = dict(self._head, segment=self.segment, previous=self._kept[-1].name)
        try:
            self._write_head()
        except OSError:
            pass
        self._kept.append(nxt)
        while len(self._kept) > SEGMENTS:
            old = self._kept.pop(1)  # the first segment stays: the actor's start, which replay runs
            try:
                old.unlink()
            except OSError:
                pass
            self.deleted += 1

    def _drain_mixed(self, items: list, chunks: list) -> None:
        """Packs what the hot path left unpacked, in order, onto chunks; a record that cannot be packed is counted
        in `lost`."""
        limit, run = self.body_limit, []
        for item in items:
            if len(item) == 8 and type(item) is tuple:
                run.append(item)
                continue
            if run:
                self._pack_run(run, chunks)
                run = []
            if type(item) is bytes:  # records packed by their producer
                chunks.append(item)
                continue
            try:
                chunks.append(self._finish(item, limit))
            except Exception:  # a record that cannot be packed is lost, not the writer thread
                self.lost += 1
        if run:
            self._pack_run(run, chunks)

    def _pack_run(self, run: list, chunks: list) -> None:
        try:
            data = self._packer.pack(run)
        except Exception:  # one bad record: pack them one by one and lose only that one
            for rec in run:
                try:
                    chunks.append(self._packer.pack(rec))
                except Exception:
                    self.lost += 1
            return
        k = len(run)
        chunks.append(memoryview(data)[1 if k < 16 else 3 if k < 65536 else 5:])

    def _finish(self, item: tuple, limit: int) -> bytes:
        ev, t, header, body, refs, buffers, extra = item
        if header is not None and type(header) is not bytes:
            header = bytes(header)
        if body is None:
            size, body_hash = 0, None
        else:
            size, body_hash = len(body), None
            if size > limit:
                body_hash, body = digest(body), None
            elif type(body) is not bytes:
                body = bytes(body)
        return self._packer.pack([ev, t, header, body, size, body_hash,
                                  self._arrays(refs, buffers) if refs else None, extra])

    def _arrays(self, refs, buffers) -> list:
        arrays = []
        for i, ref in enumerate(refs):
            buf = buffers[i] if buffers is not None and i < len(buffers) else None
            data, h = None, getattr(ref, "sum", None)  # known already: the mailbox's or the sender's (ArraySums)
            if buf is not None:
                mem = buf.buffer if hasattr(buf, "buffer") else buf
                if h is None:
                    h = digest(mem)
                if self.keep_arrays:
                    data = bytes(mem)
            arrays.append([ref.dtype, list(ref.shape), ref.kind, ref.nbytes, h, data])
        return arrays

    def flush(self) -> None:
        self._drain()

    def close(self) -> None:
        """Write what is queued and the end record (a file without one was cut short: its process killed)."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=5)
        self._drain()
        with self._drain_lock:
            try:
                self._file.write(self._end_record({"records": self.records, "lost": self.lost}))
                self._file.close()
            except (OSError, ValueError):
                pass


def _plain(obj):
    import numpy as np
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (tuple, set)):
        return list(obj)
    torch = __import__("sys").modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return obj.detach().cpu().tolist()
    raise TypeError(f"cannot record a {type(obj).__name__}")
