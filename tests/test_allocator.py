"""glibc malloc settings for large received messages (slime_actors/mailbox/allocator.py)."""

import subprocess
import sys
import textwrap

import pytest

from slime_actors.mailbox import allocator
from slime_actors.runtime import RuntimeConfig

glibc = pytest.mark.skipif(not allocator._glibc(), reason="the settings exist only in glibc")

# In a fresh interpreter: how many bytes glibc maps (rather than takes from a heap) for a 16 MiB allocation, before
# and after the same allocation has been freed once -- the pattern of a process receiving one array after another --
# and how large the heap still is after two such blocks, live at once (a frame still being sent back while the
# next arrives), have both been freed.
PROBE = textwrap.dedent("""
    import ctypes, sys
    from slime_actors.mailbox import allocator
    from slime_actors.mailbox.mailbox import Mailbox, MailboxConfig

    class Info(ctypes.Structure):  # struct mallinfo2
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Info
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    Mailbox("probe/0", config=MailboxConfig(malloc_keep_mib=int(sys.argv[1])))
    mapped = []
    for _ in range(3):
        p = libc.malloc(16 << 20)
        mapped.append(libc.mallinfo2().hblkhd)
        libc.free(p)
    a, b = libc.malloc(16 << 20), libc.malloc(16 << 20)
    libc.free(b)
    libc.free(a)
    print(mapped[0], mapped[-1], libc.mallinfo2().arena)
""")


def _probe(keep_mib: int) -> tuple[int, int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, str(keep_mib)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    first, last, arena = map(int, out.stdout.splitlines()[-1].split())  # (a log line may come first)
    return first, last, arena


@glibc
def test_a_mailbox_makes_large_buffers_come_from_the_heap_and_stay():
    first, last, arena = _probe(256)
    assert first < 16 << 20 and last < 16 << 20  # never mapped: taken from the heap
    assert arena >= 32 << 20  # and kept there after free, for the next messages


@glibc
def test_zero_leaves_malloc_alone():
    first, _, arena = _probe(0)
    assert first >= 16 << 20  # glibc's default: the first 16 MiB block is mapped,
    assert arena < 16 << 20  # and two freed blocks go back to the OS


def test_bad_values_are_refused_with_the_setting_named():
    for bad in (-1, 1.5, "256", True):
        with pytest.raises(ValueError, match="malloc_keep_mib"):
            allocator.keep_freed(bad)
    with pytest.raises(ValueError, match="SLIME_ACTORS_MALLOC_KEEP_MIB"):
        RuntimeConfig.from_env({"SLIME_ACTORS_MALLOC_KEEP_MIB": "lots"})


def test_the_setting_travels_to_child_processes():
    cfg = RuntimeConfig.from_env({"SLIME_ACTORS_MALLOC_KEEP_MIB": "0"})
    assert cfg.mailbox.malloc_keep_mib == 0
    assert RuntimeConfig.from_env(cfg.env()).mailbox.malloc_keep_mib == 0


def test_nothing_is_done_without_glibc(monkeypatch):
    monkeypatch.setattr(allocator, "_glibc", lambda: False)
    monkeypatch.setattr(allocator, "_applied", None)
    assert allocator.keep_freed(64) is False
