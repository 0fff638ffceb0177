"""Trace and wire checksums (slime_actors/traces/digest.py) match their documented definition, whichever thread
computes which piece, in a forked child and while the interpreter shuts down."""

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
import xxhash

from slime_actors.traces import digest as d


def reference(data: bytes) -> str:
    """docs/trace-format.md's definition of xxh3_64_tree, written out plainly."""
    if len(data) <= 1 << 20:
        return xxhash.xxh3_64_hexdigest(data)
    pieces = [data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    return xxhash.xxh3_64_hexdigest(b"".join(xxhash.xxh3_64_intdigest(p).to_bytes(8, "big") for p in pieces))


SIZES = [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 3 << 20, (4 << 20) - 7, 4 << 20, (16 << 20) + 12345]


@pytest.mark.parametrize("n", SIZES)
def test_the_tree_checksum_is_its_definition(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    want = reference(data)
    assert d.xxh3_64_tree(data) == want == d.digest(data)
    assert d.xxh3_64_tree(bytearray(data)) == want
    assert d.xxh3_64_tree(np.frombuffer(data, np.uint8)) == want
    if n % 4 == 0 and n:  # a float32 array, whose memoryview is not of bytes
        assert d.xxh3_64_tree(np.frombuffer(data, np.float32)) == want
    if n <= 1 << 20:
        assert want == d.digest(data, "xxh3_64")  # the same checksum as files before the tree, for small data


def test_serial_and_threaded_give_the_same_checksum(monkeypatch):
    data = os.urandom((9 << 20) + 3)
    threaded = d.xxh3_64_tree(data)
    monkeypatch.setattr(d, "PARALLEL_MIN", 1 << 40)
    assert d.xxh3_64_tree(data) == threaded == reference(data)
    monkeypatch.setattr(d, "PARALLEL_MIN", 0)
    monkeypatch.setattr(d, "_helpers", lambda: (None, 0))  # one CPU
    assert d.xxh3_64_tree(data) == threaded


def test_other_algorithms_and_unknown_names():
    assert d.digest(b"abc", "crc32") == f"{zlib.crc32(b'abc') & 0xFFFFFFFF:08x}"
    assert d.digest(b"abc", "xxh3_64") == xxhash.xxh3_64_hexdigest(b"abc")
    with pytest.raises(ValueError, match="unknown trace digest 'md5'.*xxh3_64_tree"):
        d.digest(b"abc", "md5")


CHILD = """
import os, sys
from slime_actors.traces import digest as d
data = os.urandom(8 << 20)
want = d.xxh3_64_tree(data)  # the parent's threads exist now
pid = os.fork()
if pid == 0:  # the child has none of them: it must make its own, not wait for the parent's
    os._exit(0 if d.xxh3_64_tree(data) == want else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""

SHUTDOWN = """
import atexit, os
from slime_actors.traces import digest as d
data = os.urandom(8 << 20)
d.xxh3_64_tree(data)
@atexit.register
def last():  # as a trace writer's close does: after concurrent.futures has stopped taking new work
    print(d.xxh3_64_tree(data) == d.digest(bytes(data)), flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_checksums_with_threads_of_its_own():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "0", out.stderr


def test_checksums_still_work_while_the_interpreter_exits():
    out = subprocess.run([sys.executable, "-c", SHUTDOWN], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
