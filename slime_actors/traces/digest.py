"""Content checksums of trace records: bodies over the limit and array frames (docs/trace-format.md, `digest`).

A checksum tells changed data from unchanged in a trace diff or a replay; it is no defence against a forger. Each
trace file names the algorithm its checksums were made with, and replay checks a recording with that one:

* ``xxh3_64_tree`` (written now): data of at most PIECE bytes (1 MiB) is checksummed as XXH3-64; longer data is cut
  into PIECE-byte pieces (the last one shorter), and its checksum is the XXH3-64 of the pieces' XXH3-64s, each as 8
  big-endian bytes, one after the other. Always 16 lowercase hex digits. The pieces of a large frame are checksummed
  by several threads at once (xxhash lets go of the GIL): a traced 16 MiB array costs its sender ~0.5 ms instead of
  ~1 ms on 2 cores, and less with more (docs/performance.md).
* ``xxh3_64``: XXH3-64 of the whole data (files written before the tree, and the same checksum for data up to 1 MiB).
* ``crc32``: zlib's CRC-32, 8 hex digits (files written before the header named its digest).
"""

from __future__ import annotations

import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import xxhash

DIGEST = "xxh3_64_tree"
DIGESTS = ("xxh3_64_tree", "xxh3_64", "crc32")
PIECE = 1 << 20
PARALLEL_MIN = 4 << 20  # below this the pieces are checksummed on the calling thread: a hand-off costs ~50 us
_intdigest, _hexdigest = xxhash.xxh3_64_intdigest, xxhash.xxh3_64_hexdigest

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def _helpers() -> tuple[ThreadPoolExecutor | None, int]:
    """This process's checksum threads (made on first use, again after a fork) and how many there are."""
    global _pool, _pool_pid
    n = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) - 1
    if n <= 0:
        return None, 0
    if _pool is None or _pool_pid != os.getpid():
        with _pool_lock:
            if _pool is None or _pool_pid != os.getpid():
                _pool = ThreadPoolExecutor(n, thread_name_prefix="slime-checksum")
                _pool_pid = os.getpid()
    return _pool, n


def _pieces(mem: memoryview, first: int, last: int) -> bytes:
    return b"".join(_intdigest(mem[i * PIECE:(i + 1) * PIECE]).to_bytes(8, "big") for i in range(first, last))


def xxh3_64_tree(data) -> str:
    """The ``xxh3_64_tree`` checksum of a bytes-like object (C-contiguous), as 16 lowercase hex digits."""
    mem = memoryview(data)
    if mem.ndim != 1 or mem.itemsize != 1:
        mem = mem.cast("B")
    n = mem.nbytes
    if n <= PIECE:
        return _hexdigest(mem)
    count = -(-n // PIECE)
    pool, helpers = _helpers() if n >= PARALLEL_MIN else (None, 0)
    if pool is None:
        return _hexdigest(_pieces(mem, 0, count))
    # contiguous runs of pieces: one per helper thread and one for this thread (the first), in order
    bounds = [count * k // (helpers + 1) for k in range(helpers + 2)]
    try:
        futures = [pool.submit(_pieces, mem, bounds[k], bounds[k + 1]) for k in range(1, helpers + 1)]
    except RuntimeError:  # the interpreter is shutting down (a trace writer's last drain): no more threads
        return _hexdigest(_pieces(mem, 0, count))
    mine = _pieces(mem, bounds[0], bounds[1])
    return _hexdigest(b"".join([mine] + [f.result() for f in futures]))


def digest(data, algo: str = DIGEST) -> str:
    """The checksum of `data` by `algo`, a trace file's "digest" (one of DIGESTS)."""
    if algo == "xxh3_64_tree":
        return xxh3_64_tree(data)
    if algo == "xxh3_64":
        return _hexdigest(data)
    if algo == "crc32":
        return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"
    raise ValueError(f"unknown trace digest {algo!r} (known: {', '.join(DIGESTS)})")
