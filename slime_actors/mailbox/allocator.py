"""glibc malloc settings that let a process reuse the memory of large received messages.

ZeroMQ allocates every received message of more than a few bytes with one `malloc` of its size, and frees it when
the last view of the frame goes. glibc serves a large allocation from a fresh `mmap` until freeing one raises its
(dynamic) threshold, and gives the top of a heap back to the OS once more than twice that threshold is free there.
Between the two, a process that receives a 16 MiB array after array keeps getting freshly mapped pages: 4096 page
faults, each a zeroed page, ~2 ms of a 10 ms round trip on a 2-core VM (docs/performance.md, "glibc's trimming").

`keep_freed(mib)` fixes the mmap threshold at glibc's largest (32 MiB: larger blocks are still mapped and returned
on free; unless the process was started with MALLOC_MMAP_THRESHOLD_ set, which then stays) and keeps up to `mib` MiB free at the top of a heap before trimming, so a frame's buffer is reused while
it is hot. The price is memory: up to `mib` MiB that a heap once held stays with the process, and the heaps of
other threads (libzmq's I/O thread allocates received messages in its own) are at most 64 MiB each in glibc, so at
64 and more they keep what they once held. Set by MailboxConfig.malloc_keep_mib
(SLIME_ACTORS_MALLOC_KEEP_MIB); 0 leaves malloc as it was. Process-wide: the last mailbox to ask wins. Nothing is
done where the C library is not glibc.

`trim()` gives what every heap holds free back to the OS at once (glibc's `malloc_trim(0)`, which also releases the
free pages inside heaps, not only their tops): the trainer calls it after an update (--trainer-release-memory),
when gigabytes of activations were freed into heaps that the settings above keep.
"""

from __future__ import annotations

import ctypes
import os

import structlog

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's cap on M_MMAP_THRESHOLD on 64-bit (HEAP_MAX_SIZE / 2)

_applied: int | None = None  # the MiB this process last set; None: untouched
log = structlog.get_logger("slime_actors.allocator")


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # not a glibc system
        return False


def _libc():
    if not _glibc():
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def keep_freed(mib: int) -> bool:
    """Apply the settings above for `mib` MiB (0: do nothing). Returns whether malloc was changed now."""
    global _applied
    if not isinstance(mib, int) or isinstance(mib, bool) or mib < 0:
        raise ValueError(f"malloc_keep_mib (SLIME_ACTORS_MALLOC_KEEP_MIB) must be an integer >= 0, got {mib!r}")
    if mib == 0 or mib == _applied:
        return False
    libc = _libc()
    if libc is None:
        return False
    # a threshold the process was started with (glibc's environment tunable) is the user's: it stays
    ok = os.environ.get("MALLOC_MMAP_THRESHOLD_") is not None or libc.mallopt(_M_MMAP_THRESHOLD,
                                                                               MMAP_THRESHOLD_MAX) == 1
    ok = libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(min(mib << 20, 2**31 - 1))) == 1 and ok
    if not ok:
        log.warning("mallopt refused a setting; malloc left with glibc's defaults", keep_mib=mib)
        return False
    _applied = mib
    log.debug("malloc keeps large message buffers", mmap_threshold=MMAP_THRESHOLD_MAX, keep_mib=mib)
    return True


def trim() -> bool:
    """glibc's ``malloc_trim(0)``: free memory of every arena (heap tops and whole free pages inside) back to the OS.
    Returns whether any was released; False where the C library is not glibc."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))
