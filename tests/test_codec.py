"""Codec: arrays travel bit-exact as out-of-band frames; bad input is a ProtocolError naming the problem."""

import msgpack
import numpy as np
import pytest
import torch

from slime_actors.mailbox import codec
from slime_actors.mailbox.codec import ProtocolError


def roundtrip(body):
    packed, buffers, refs = codec.encode_body(body)
    frames = [bytes(b) for b in buffers]
    assert [r.nbytes for r in refs] == [len(f) for f in frames]
    return codec.decode_body(packed, frames)


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
                                   "float16", "float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5), (2, 3, 4), (1, 0, 3)])
def test_numpy_roundtrip_bit_exact(dtype, shape):
    rng = np.random.default_rng(0)
    a = np.asarray((rng.standard_normal(shape) * 100).astype(dtype) if dtype != "bool" else rng.random(shape) > 0.5)
    if np.issubdtype(a.dtype, np.floating) and a.size:
        a.reshape(-1)[0] = np.nan  # NaN payloads must survive too
    out = roundtrip({"a": a})["a"]
    assert isinstance(out, np.ndarray)
    assert out.dtype == a.dtype and out.shape == a.shape
    assert out.tobytes() == a.tobytes()


def test_noncontiguous_and_big_endian_arrays():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    assert not a.flags.c_contiguous
    out = roundtrip([a])[0]
    np.testing.assert_array_equal(out, a)
    b = np.arange(5, dtype=">i4")
    out = roundtrip(b)
    assert out.dtype == np.dtype("<i4")
    np.testing.assert_array_equal(out, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                                   torch.uint8, torch.bool, torch.float64])
def test_torch_roundtrip_bit_exact(dtype):
    t = (torch.randn(3, 4, 5) * 10).to(dtype)
    out = roundtrip({"t": t, "nested": [t[0], {"deep": t[1:]}]})
    assert isinstance(out["t"], torch.Tensor)
    assert out["t"].dtype == dtype and out["t"].shape == t.shape
    assert torch.equal(out["t"].view(torch.uint8) if dtype != torch.bool else out["t"],
                       t.view(torch.uint8) if dtype != torch.bool else t)
    assert torch.equal(out["nested"][1]["deep"], t[1:])


def test_arrays_are_not_copied_on_encode():
    a = np.zeros(1 << 20, dtype=np.uint8)
    _, buffers, _ = codec.encode_body({"a": a})
    assert np.shares_memory(np.frombuffer(buffers[0], dtype=np.uint8), a)
    t = torch.zeros(1 << 18)
    _, buffers, _ = codec.encode_body(t)
    assert np.frombuffer(buffers[0], dtype=np.float32).ctypes.data == t.data_ptr()


def test_non_cpu_tensor_is_refused_clearly():
    t = torch.empty(4, device="meta")
    with pytest.raises(TypeError, match=r"meta tensor cannot travel.*\.cpu\(\).*host_copy=True"):
        codec.encode_body({"w": t})


def test_unencodable_object_names_the_type():
    with pytest.raises(TypeError, match="cannot put a object in a message body"):
        codec.encode_body({"x": object()})


def test_bad_array_references():
    ref = lambda *r: msgpack.ExtType(codec.ARRAY_EXT, msgpack.packb(list(r)))  # noqa: E731
    cases = [
        (ref(0, "float32", [4], "numpy"), [], "frame 0, but the message has 0"),
        (ref(0, "float32", [4], "numpy"), [b"\0" * 15], "has 15 bytes, but float32\\[4\\] needs 16"),
        (ref(0, "float99", [4], "numpy"), [b"\0" * 16], "unknown array dtype"),
        (ref(0, "float32", [-1], "numpy"), [b"\0" * 16], "bad array shape"),
        (ref(0, "float32", [1 << 62, 1 << 62], "numpy"), [b"\0" * 16], "needs"),
        (ref(0, "float32", [4], "pickle"), [b"\0" * 16], "unknown array kind"),
        (ref("x"), [], "must be \\[frame_index, dtype, shape, kind\\]"),
        (msgpack.ExtType(42, b"x"), [], "unknown msgpack ext type 42"),
    ]
    for obj, frames, msg in cases:
        with pytest.raises(ProtocolError, match=msg):
            codec.decode_body(msgpack.packb({"a": obj}), frames)
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        codec.decode_body(b"\xc1", [])


def good_header(**over):
    h = codec.make_header("ask", "a/0", "b/0", "m", 1, codec.new_trace_id(), None, deadline=1.0)
    h.update(over)
    return h


def v2_header(**over) -> list:
    h = codec.header_v2("ask", "a/0", "b/0", "m", 1, codec.new_trace_id(), None, deadline=1.0)
    for k, v in over.items():
        h[codec.V2_FIELDS.index(k)] = v
    return h


BAD_FIELDS = [
    ({"kind": "shout"}, "unknown message kind 'shout'"),
    ({"id": 5}, "header field 'id' must be str"),
    ({"seq": "1"}, "header field 'seq' must be int"),
    ({"seq": True}, "header field 'seq' must be int"),
    ({"method": None}, "header field 'method' must be str"),
    ({"deadline": "soon"}, "header field 'deadline' must be float or nil"),
    ({"kind": "reply"}, "must carry 're'"),
    ({"nframes": -1}, "'nframes' must be >= 0"),
]


@pytest.mark.parametrize("over,msg", [
    ({"v": 3}, "protocol version 3 is not supported"),
    ({"v": 2}, "a version 2 header is a msgpack array, got a map"),
    ({"v": None}, "protocol version None"),
] + BAD_FIELDS)
def test_header_validation_version_1(over, msg):
    with pytest.raises(ProtocolError, match=msg):
        codec.decode_header(msgpack.packb(good_header(**over)))


@pytest.mark.parametrize("over,msg", [
    ({"v": 1}, "its first field \\(the version\\) is 1"),
    ({"v": 3}, "its first field \\(the version\\) is 3"),
    ({"v": True}, "its first field \\(the version\\) is True"),
] + BAD_FIELDS)
def test_header_validation_version_2(over, msg):
    with pytest.raises(ProtocolError, match=msg):
        codec.decode_header(msgpack.packb(v2_header(**over)))


def test_both_versions_decode_to_the_same_map():
    a = v2_header(parent="0" * 16, idem="k", nframes=2)
    m = codec.decode_header(msgpack.packb(a))
    v1 = {k: x for k, x in zip(codec.V2_FIELDS, a) if x is not None}
    v1["v"] = 1
    assert codec.decode_header(msgpack.packb(v1)) == dict(m, v=1)
    assert m["v"] == 2 and m["nframes"] == 2 and "re" not in m
    # nils and nframes 0 are left out, as a version-1 map leaves them out
    assert "nframes" not in codec.decode_header(msgpack.packb(v2_header(nframes=0)))
    # later versions may append fields: a version-2 reader ignores them (after [14], sums, nil here)
    assert codec.decode_header(msgpack.packb(a + [None])) == m
    assert codec.decode_header(msgpack.packb(a + [None, "future", 1])) == m
    with pytest.raises(ProtocolError, match="array of 14 fields"):
        codec.decode_header(msgpack.packb(a[:13]))


def test_header_must_be_an_array_or_a_map():
    with pytest.raises(ProtocolError, match="array of 14 fields"):
        codec.decode_header(msgpack.packb([1, 2, 3]))
    with pytest.raises(ProtocolError, match="must be a msgpack array \\(version 2\\) or map \\(version 1\\)"):
        codec.decode_header(msgpack.packb("hello"))
    with pytest.raises(ProtocolError, match="header is not valid msgpack"):
        codec.decode_header(b"")


def test_integer_timestamps_are_accepted():
    h = codec.decode_header(msgpack.packb(good_header(ts=5, deadline=7)))
    assert h["ts"] == 5.0 and h["deadline"] == 7.0


def test_ids_and_traceparent():
    h = good_header()
    assert len(h["id"]) == 16 and len(h["trace"]) == 32
    assert codec.traceparent(h) == f"00-{h['trace']}-{h['id']}-01"
    assert codec.new_id() != codec.new_id()
