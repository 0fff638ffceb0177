"""Per-process trace files, written off the hot path (docs/trace-format.md).

The mailbox calls `TraceWriter.record(...)` for every message it sends, receives and finishes handling. That call only
appends a tuple to a deque; a writer thread drains the deque every `flush_interval` seconds, packs the records with
msgpack and appends them to RUN_DIR/traces/<role>-<index>.<pid>.trace. Header and body bytes are the ones that went
over the wire, so recording costs no extra encoding on the event loop.
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import msgpack

TRACE_FORMAT = "slime-actors-trace"
TRACE_VERSION = 1

# events
SEND, RECV, HANDLED, DROP, INPUT = "send", "recv", "handled", "drop", "input"


def digest(data) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def trace_file_name(actor: str, pid: int | None = None) -> str:
    return f"{actor.replace('/', '-')}.{pid or os.getpid()}.trace"


class TraceWriter:
    """Writes one actor's trace file. Thread-safe `record`; `close` flushes everything recorded so far."""

    def __init__(self, path: str | os.PathLike, actor: str, *, meta: dict | None = None, body_limit: int = 65536,
                 keep_arrays: bool = False, flush_interval: float = 0.05):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.actor = actor
        self.body_limit = body_limit
        self.keep_arrays = keep_arrays
        self.flush_interval = flush_interval
        self.records = 0
        self._q: collections.deque = collections.deque()
        # The hot path's entry: append one finished record tuple (event, time_ns, header, body, refs, buffers,
        # extra) -- a bound deque.append, so recording a message is a single C call (see record()).
        self.append = self._q.append
        self._file = open(self.path, "ab", buffering=1 << 20)
        self._packer = msgpack.Packer(use_bin_type=True)
        head = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "actor": actor, "pid": os.getpid(),
                "host": socket.gethostname(), "started_ns": time.time_ns(), "body_limit": body_limit,
                "keep_arrays": keep_arrays}
        head.update(meta or {})
        self._file.write(self._packer.pack(head))
        self._file.flush()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"trace-writer:{actor}", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- hot path ---------------------------------------------------------------------------------------------
    def record(self, ev: str, header, body=None, refs=None, buffers=None, extra: dict | None = None) -> None:
        """Queue one record. `header`/`body` are the raw msgpack bytes (or memoryviews) of the frames."""
        self._q.append((ev, time.time_ns(), header, body, refs, buffers, extra))

    def record_input(self, name: str, value: Any) -> None:
        """Record a nondeterministic input (an engine's output, a clock reading) so replay can feed it back."""
        self._q.append((INPUT, time.time_ns(), None, msgpack.packb(value, use_bin_type=True, default=_plain),
                        None, None, {"name": name}))

    # -- writer thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        q, pack, out = self._q, self._packer.pack, []
        while q:
            try:
                ev, t, header, body, refs, buffers, extra = q.popleft()
            except IndexError:
                break
            body_size, body_hash = 0, None
            if body is not None:
                body_size = len(body)
                if body_size > self.body_limit:
                    body_hash, body = digest(body), None
                else:
                    body = bytes(body)
            arrays = None
            if refs:
                arrays = []
                for i, ref in enumerate(refs):
                    buf = buffers[i] if buffers is not None and i < len(buffers) else None
                    data = None
                    if buf is not None and self.keep_arrays:
                        data = bytes(buf.buffer if hasattr(buf, "buffer") else buf)
                    h = digest(buf.buffer if hasattr(buf, "buffer") else buf) if buf is not None else None
                    arrays.append([ref.dtype, list(ref.shape), ref.kind, ref.nbytes, h, data])
            out.append(pack([ev, t, bytes(header) if header is not None else None, body, body_size, body_hash,
                             arrays, extra]))
        if out:
            try:
                self._file.write(b"".join(out))
                self._file.flush()
                self.records += len(out)
            except (OSError, ValueError):
                pass  # disk full or closed: tracing must never take the actor down

    def flush(self) -> None:
        self._drain()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=5)
        self._drain()
        try:
            self._file.close()
        except OSError:
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
