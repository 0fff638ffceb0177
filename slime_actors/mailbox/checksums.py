"""Array checksums that travel with a traced message (the header's `sums`, docs/wire-format.md).

A trace records each array frame by shape, dtype and checksum. Without help every hop would checksum a large array
twice -- its sender for the `send` record, its receiver for the `recv` record -- and an actor that passes a
received array on (an echo, a buffer handing a batch to a trainer) a third and a fourth time. With tracing on, a
mailbox therefore checksums what it sends once, on the event loop before the send, and declares the checksums in
the header; a traced receiver records the declared ones instead of computing its own (or, from a sender that
declared none, computes them as the message arrives: before a handler can change a received torch tensor), and
remembers them for the frames it received, so that an array sent on unchanged is not checksummed again.

"Unchanged" is decided without reading the bytes. A received numpy array is a read-only view of its frame (codec:
nothing in numpy can write to it, and its WRITEABLE flag cannot be set); an outgoing buffer that is read-only, is
such a view at the end of its chain of numpy bases, and is as long as the frame (a C-contiguous block of the frame's
length inside the frame is the whole frame) holds the frame's bytes as they arrived. A received torch tensor is
writable (torch has no read-only tensors), so its frame's view is writable and never matches; a writable array is
always checksummed. Small frames are checksummed every time (cheaper than the cache's bookkeeping).

The receiver trusts the sender's checksums as it trusts the sender's bytes: they tell changed data from unchanged
in a diff or a replay, as the trace's own checksums do, and are no defence against a forger.
"""

from __future__ import annotations

import re
import weakref

import numpy as np
import xxhash

from .errors import ProtocolError

# The wire's checksum: XXH3-64 as 16 lowercase hex digits, the trace writer's DIGEST (a test keeps them equal).
ALGO = "xxh3_64"
_hexdigest = xxhash.xxh3_64_hexdigest
_SUM = re.compile(r"[0-9a-f]{16}")
# Frames at least this large are remembered, and looked up when sent; below it a checksum costs a few
# microseconds at most (~2.4 us for 64 KiB), not worth a weak reference per received frame.
FORWARD_MIN = 1 << 16


def check_sums(sums, nframes: int) -> list:
    """Validate a header's `sums` field: a list of nframes checksums. Raises ProtocolError naming what is wrong."""
    if type(sums) is not list:
        raise ProtocolError(f"header field 'sums' must be an array of str or nil, got {type(sums).__name__}")
    if len(sums) != nframes:
        raise ProtocolError(f"header field 'sums' has {len(sums)} checksum(s) for {nframes} array frame(s)")
    for s in sums:
        if type(s) is not str or not _SUM.fullmatch(s):
            raise ProtocolError(f"header field 'sums' holds {s!r:.40}, not an XXH3-64 checksum (16 lowercase hex "
                                "digits)")
    return sums


class ArraySums:
    """One mailbox's checksums of array frames: computes them for sends, remembers them for received frames."""

    def __init__(self):
        self._known: dict[int, tuple] = {}  # id(frame) -> (weak reference to the frame, checksum)
        self.computed = 0  # frames checksummed here (for tests and benchmarks)
        self.reused = 0    # frames sent on with the checksum declared when they were received

    def of_frames(self, buffers: list) -> list[str]:
        """Checksum received frames' memory now (their sender declared none)."""
        self.computed += len(buffers)
        return [_hexdigest(b) for b in buffers]

    def received(self, frames: list, sums: list) -> None:
        """Remember the declared checksums of large received frames while those frames are alive."""
        known = self._known
        for frame, s in zip(frames, sums):
            if len(frame) >= FORWARD_MIN and hasattr(frame, "buffer"):  # bytes (a copied frame): not worth it
                key = id(frame)
                ref = weakref.ref(frame, lambda r, k=key: known.get(k, (None,))[0] is r and known.pop(k, None))
                known[key] = (ref, s)

    def for_send(self, buffers: list, refs: list | None = None) -> list[str]:
        """The checksums of the array buffers about to be sent (codec's memoryviews), in order; also set as the
        `sum` of each of their ArrayRefs when given (what the trace writer records)."""
        out = []
        known = self._known
        for buf in buffers:
            s = self._forwarded(buf) if known and buf.readonly and len(buf) >= FORWARD_MIN else None
            if s is None:
                s = _hexdigest(buf)
                self.computed += 1
            else:
                self.reused += 1
            out.append(s)
        if refs is not None:
            for ref, s in zip(refs, out):
                ref.sum = s
        return out

    def _forwarded(self, buf: memoryview) -> str | None:
        o = buf.obj
        while isinstance(o, np.ndarray):
            o = o.base
        if type(o) is not memoryview or not o.readonly:
            return None
        frame = o.obj
        e = self._known.get(id(frame))
        if e is None or e[0]() is not frame or len(buf) != len(frame):
            return None
        return e[1]
