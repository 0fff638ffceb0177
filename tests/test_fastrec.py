"""The trace record's C packer (slime_actors/traces/_fastrec.c) gives msgpack's bytes exactly, refuses what it cannot
pack, and the writer falls back to msgpack when it is not built."""

import shutil
import sysconfig

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_actors.traces import writer

C = writer._c_rec
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
    monkeypatch.setattr(writer, "_c_rec", None)
    w = writer.TraceWriter(tmp_path / "a.trace", "a/0")
    try:
        assert w.rec is not C
        rec = w.rec("recv", 123, b"\x9e" + b"h" * 20, b"\x81\xa1x\x01", 7)
        assert msgpack.unpackb(rec) == ["recv", 123, b"\x9e" + b"h" * 20, b"\x81\xa1x\x01", 4, None, None, None, 7]
        w.append(rec)
    finally:
        w.close()
    with open(tmp_path / "a.trace", "rb") as f:
        head, got = list(msgpack.Unpacker(f))
    assert head["actor"] == "a/0" and got[-1] == 7
