"""The trace record's C packer (slime_actors/traces/_fastrec.c) gives msgpack's bytes exactly, refuses what it cannot
pack, and the writer falls back to msgpack when it is not built."""

import io
import shutil
import sysconfig
import time

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_actors.traces import writer

try:
    from slime_actors.traces._fastrec import rec as C
except ImportError:  # not built: the writer's fallback is tested below either way
    C = None
needs_c = pytest.mark.skipif(C is None, reason="the C extension is not built (no compiler at install time)")
PACK = msgpack.Packer(use_bin_type=True).pack


def test_the_extension_is_built_where_a_compiler_is():
    """setup.py builds it as optional: an install that had a compiler and still lacks it is a broken build."""
    if shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc") is None:
        pytest.skip("no C compiler on this machine: the writer packs records with msgpack (tested below)")
    assert C is not None, "slime_actors/traces/_fastrec.c was not built: run `pip install -e .` again and read its log"


# sizes at msgpack's encoding boundaries (fixint/uint8/16/32/64, bin8/16/32)
INTS = st.one_of(st.sampled_from([0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]),
                 st.integers(0, 2**64 - 1))
BLOBS = st.one_of(st.binary(max_size=300), st.sampled_from([b"x" * 255, b"x" * 256, b"y" * 65535, b"y" * 65536]))
EVENTS = st.one_of(st.sampled_from(["send", "recv", "handled"]), st.text(st.characters(max_codepoint=127),
                                                                           max_size=31))


@needs_c
@settings(max_examples=400, deadline=None)
@given(EVENTS, INTS, BLOBS, BLOBS, st.one_of(st.none(), INTS))
def test_c_records_are_msgpacks_bytes(ev, t, header, body, dur):
    args = (ev, t, header, body) if dur is None else (ev, t, header, body, dur)
    assert C(*args) == writer.rec_py(PACK, *args)
    assert C(ev, t, memoryview(header), bytearray(body)) == writer.rec_py(PACK, ev, t, header, body)


@needs_c
@pytest.mark.parametrize("args, error, match", [
    (("recv", -1, b"", b""), ValueError, "t must be an int in"),
    (("recv", 2**64, b"", b""), ValueError, "t must be an int in"),
    (("recv", 1.0, b"", b""), TypeError, "t must be an int"),
    (("recv", True, b"", b""), TypeError, "t must be an int"),
    (("recv", 1, b"", b"", -5), ValueError, "dur must be an int in"),
    (("réception", 1, b"", b""), TypeError, "ASCII str"),
    (("x" * 32, 1, b"", b""), TypeError, "ASCII str"),
    ((b"recv", 1, b"", b""), TypeError, "ASCII str"),
    (("recv", 1, "header", b""), TypeError, "header must be bytes-like, not str"),
    (("recv", 1, b"", None), TypeError, "body must be bytes-like, not NoneType"),
    (("recv", 1, b""), TypeError, "4 or 5 arguments"),
])
def test_c_records_refuse_what_they_cannot_pack(args, error, match):
    with pytest.raises(error, match=match):
        C(*args)


def test_the_writer_falls_back_to_msgpack_without_the_extension(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "_CRecorder", None)
    w = writer.TraceWriter(tmp_path / "a.trace", "a/0")
    try:
        assert isinstance(w._rq, writer.PyRecorder)
        w.rec("recv", 123, b"\x9e" + b"h" * 20, b"\x81\xa1x\x01", 7)
    finally:
        w.close()
    with open(tmp_path / "a.trace", "rb") as f:
        head, got, end = list(msgpack.Unpacker(f))
    assert head["actor"] == "a/0" and end[0] == "end"  # (version 6: close() ends the file with an end record)
    assert got == ["recv", 123, b"\x9e" + b"h" * 20, b"\x81\xa1x\x01", 4, None, None, None, 7]


RECORDERS = [pytest.param(lambda: writer.PyRecorder(PACK), id="python"),
             pytest.param(lambda: writer._CRecorder(), id="c", marks=needs_c)]


@pytest.mark.parametrize("make", RECORDERS)
def test_a_recorder_queues_records_and_items_in_order(make):
    r = make()
    assert r.take() == ([], 0)
    r.rec("send", 1, b"h1", b"b1")
    r.rec("recv", 2, b"h2", b"b2", 9)
    r.put(("handled", 3, b"h3", None, 0, None, None, {"x": 1}))
    r.put(PACK(("recv", 4, b"h4", b"", 0, None, None, None)))
    r.rec("recv", 5, b"h5", b"b5")
    assert r.pending == 5
    items, n = r.take()
    assert n == 5 and r.pending == 0 and r.take() == ([], 0)
    records = []
    for item in items:
        records += list(msgpack.Unpacker(io.BytesIO(item))) if type(item) is bytes else [list(item)]
    assert [rec[1] for rec in records] == [1, 2, 3, 4, 5]  # the order they were queued in
    assert records[1] == ["recv", 2, b"h2", b"b2", 2, None, None, None, 9]


@needs_c
def test_the_c_recorder_grows_past_its_buffer_and_refuses_what_rec_refuses():
    r = writer._CRecorder()
    big = b"z" * 70000  # past the first 64 KiB buffer in one record, then many small ones
    r.rec("recv", 1, b"h", big)
    for i in range(5000):
        r.rec("send", i, b"h" * 50, b"b" * 20)
    with pytest.raises(TypeError, match="header must be bytes-like"):
        r.rec("recv", 1, "header", b"")
    with pytest.raises(TypeError, match="4 or 5 arguments"):
        r.rec("recv", 1, b"")
    items, n = r.take()
    assert n == 5001  # the refused ones are not queued
    assert b"".join(items) == C("recv", 1, b"h", big) + b"".join(C("send", i, b"h" * 50, b"b" * 20)
                                                                  for i in range(5000))
    with pytest.raises(TypeError, match="no arguments"):
        writer._CRecorder(1)


def test_records_lost_in_packing_are_counted_and_the_rest_written(tmp_path):
    w = writer.TraceWriter(tmp_path / "a.trace", "a/0", flush_interval=60)
    try:
        w.rec("send", 1, b"h", b"b")
        w.append(("recv", 2, b"h", b"b", 1, None, None, {"bad": object()}))  # msgpack cannot pack it
        w.rec("send", 3, b"h", b"b")
        w.flush()
        assert (w.records, w.lost) == (2, 1)
    finally:
        w.close()
    with open(tmp_path / "a.trace", "rb") as f:
        got = list(msgpack.Unpacker(f))[1:]
    assert [rec[1] for rec in got[:-1]] == [1, 3]
    assert got[-1][0] == "end" and got[-1][7] == {"records": 2, "lost": 1}


def _packed_by(how: str):
    """rec(ev, t, header, body, dur) -> the packed record, by one of the four ways there are to pack it."""
    if how == "c":
        return C
    if how == "py":
        return lambda *a: writer.rec_py(PACK, *a)

    def via(make):
        def pack(*a):
            r = make()
            r.rec(*a)
            return b"".join(r.take()[0])
        return pack
    return via(writer._CRecorder if how == "c-recorder" else lambda: writer.PyRecorder(PACK))


@pytest.mark.parametrize("how", [pytest.param("c", marks=needs_c), "py", pytest.param("c-recorder", marks=needs_c),
                                 "py-recorder"])
def test_a_duration_of_none_runs_until_now(how):
    pack = _packed_by(how)
    t = time.time_ns()
    got = msgpack.unpackb(pack("recv", t, b"h", b"b", None))
    after = time.time_ns()
    assert got[:8] == ["recv", t, b"h", b"b", 1, None, None, None] and 0 <= got[8] <= after - t
    later = after + 10**10  # a clock that stepped back: 0, not a negative time
    assert msgpack.unpackb(pack("recv", later, b"h", b"b", None))[8] == 0
    assert msgpack.unpackb(pack("recv", t, b"h", b"b", 42))[8] == 42
    assert len(msgpack.unpackb(pack("recv", t, b"h", b"b"))) == 8
