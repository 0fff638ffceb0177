"""What the mailbox needs of a tracer: tracing is a plug-in of the mailbox, not an import of it.

A Mailbox is handed a tracer object (or None: untraced) and records through it every message it sends, receives or
drops; it never imports the trace writer. `slime_actors.recorder.writer.TraceWriter` implements both protocols below,
and the trace format is its business (docs/trace-format.md). Anything with `record`, `body_limit` and `keep_arrays`
will do -- a test's list of records, replay's stand-in.

Two ways in, as the writer has them:

* `record(event, header, body, refs, buffers, extra)`: any record, from any thread. `header` and `body` are the
  frames' bytes as they went over the wire (or memoryviews of them), `refs` the body's array references
  (codec.ArrayRef, each with its checksum in `.sum`), `buffers` the array frames or copies of them (a tracer that
  keeps arrays), `extra` a small map (a drop's reason).
* the hot path (`HotPathTracer`), from the event loop's thread only, for the common record with no per-record
  object: `rec(event, time_ns, header, body[, dur_ns])` queues the record of a message without arrays whose header
  and body are bytes within `body_limit`; `append(item)` queues a record packed with `pack`, or the 7-tuple
  (event, time_ns, header, body, refs, buffers, extra) that the tracer finishes later (checksums of bodies over the
  limit and of array frames without one). `fast_entries` tells which way a tracer takes.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable


@runtime_checkable
class Tracer(Protocol):
    """Records messages: the slow path, which every tracer has."""

    body_limit: int  # bodies over it are recorded by size and checksum, not kept
    keep_arrays: bool  # array frames are recorded in full, not only by checksum: the mailbox hands over copies

    def record(self, ev: str, header, body=None, refs=None, buffers=None, extra: dict | None = None) -> None: ...


@runtime_checkable
class HotPathTracer(Tracer, Protocol):
    """A tracer with the event loop's entries: one call per record, no object per record."""

    append: Callable[[Any], None]
    pack: Callable[[Any], bytes]
    rec: Callable[..., None]


# a traced reply's extra field: it came after its ask had timed out (or a second time); nothing waited for it, and a
# replay times that ask out as the run did instead of answering it with this reply
LATE = "late"


def fast_entries(tracer: Tracer | None) -> tuple[Any, Any, Any]:
    """(append, pack, rec) of a tracer that has the hot path's entries, else (None, None, None): use record()."""
    entries = getattr(tracer, "append", None), getattr(tracer, "pack", None), getattr(tracer, "rec", None)
    return entries if None not in entries else (None, None, None)
