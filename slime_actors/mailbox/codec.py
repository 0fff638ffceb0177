"""The wire codec: envelope headers and bodies as msgpack, arrays as extra frames (docs/wire-format.md).

A message is a ZeroMQ multipart message of 2 + N frames:

    frame 0   header  the envelope (version, kind, ids, sender, receiver, method, ...): a msgpack array of fixed
                      positions (protocol version 2), or a msgpack map (version 1, still accepted)
    frame 1   body    msgpack value; arrays inside it are ext type 1 referring to frames 2..
    frame 2.. arrays  raw little-endian C-contiguous bytes, one frame per array, sent without copying

Nothing here ever unpickles: msgpack decodes only maps, arrays, strings, bytes, numbers, booleans and nil, and
ext type 1 (array references) -- every other ext type is a protocol error.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from typing import Any

import msgpack
import numpy as np

from .checksums import check_sums
from .errors import ProtocolError

PROTOCOL_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
ARRAY_EXT = 1

KINDS = ("tell", "ask", "reply", "error", "hb")
REQUEST_KINDS = ("tell", "ask")
RESPONSE_KINDS = ("reply", "error")

# header keys (docs/wire-format.md lists their types)
REQUIRED_HEADER = {"v": int, "kind": str, "id": str, "trace": str, "from": str, "to": str, "method": str,
                   "seq": int, "ts": float}
OPTIONAL_HEADER = {"parent": str, "deadline": float, "idem": str, "re": str, "nframes": int}
# Version 2: the same fields as an array, in this order (nil where an optional field is not set). Decoding a map
# costs a string object per key and a lookup per field; the array decodes ~1.5x and packs ~1.6x faster.
V2_FIELDS = ("v", "kind", "id", "trace", "from", "to", "method", "seq", "ts", "parent", "deadline", "idem", "re",
             "nframes")
V2_LEN = len(V2_FIELDS)
# Appended to version 2 (receivers before it ignore fields after the 14th): [14] `sums`, nil or one XXH3-64
# checksum per array frame, which a traced sender declares so that a traced receiver need not compute them
# (mailbox/checksums.py). Decoded as the map key "sums", present only when set.
SUMS_AT = V2_LEN

# dtype names on the wire <-> numpy dtypes.  bfloat16 has no numpy dtype: it travels as raw 2-byte words.
_WIRE_DTYPES = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                "float16", "float32", "float64", "complex64", "complex128"]
_NP_OF = {name: np.dtype(name).newbyteorder("<") for name in _WIRE_DTYPES}
_ITEMSIZE = {name: dt.itemsize for name, dt in _NP_OF.items()}
_ITEMSIZE["bfloat16"] = 2
for _fp8 in ("float8_e4m3fn", "float8_e5m2"):
    _ITEMSIZE[_fp8] = 1

_LITTLE = sys.byteorder == "little"
_unpackb = msgpack.unpackb  # defaults: raw=False, strict_map_key=True, and every size bounded by len(data)


def _torch():
    return sys.modules.get("torch")


class ArrayRef:
    """An array that was (or will be) carried in an out-of-band frame: what the trace records about it."""

    __slots__ = ("index", "dtype", "shape", "kind", "nbytes", "sum")

    def __init__(self, index: int, dtype: str, shape: tuple, kind: str, nbytes: int, sum: str | None = None):
        self.index, self.dtype, self.shape, self.kind, self.nbytes = index, dtype, shape, kind, nbytes
        self.sum = sum  # its frame's checksum, when known before the trace writer sees it (mailbox/checksums.py)

    def meta(self) -> list:
        return [self.dtype, list(self.shape), self.kind, self.nbytes]


class _Encoder:
    """Encodes one body; collects array buffers in the order they are referenced."""

    __slots__ = ("buffers", "refs", "host_copy")

    def __init__(self, host_copy: bool):
        self.buffers: list = []
        self.refs: list[ArrayRef] = []
        self.host_copy = host_copy

    def default(self, obj: Any):
        if isinstance(obj, np.ndarray):
            return self._array(obj, "numpy")
        torch = _torch()
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._tensor(obj, torch)
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, (tuple, set, frozenset)):
            return list(obj)
        raise TypeError(f"cannot put a {type(obj).__name__} in a message body "
                        "(allowed: None, bool, int, float, str, bytes, list, dict, numpy arrays, CPU torch tensors)")

    def _add(self, buf, dtype: str, shape: tuple, kind: str, nbytes: int) -> msgpack.ExtType:
        ref = ArrayRef(len(self.buffers), dtype, shape, kind, nbytes)
        self.buffers.append(buf)
        self.refs.append(ref)
        return msgpack.ExtType(ARRAY_EXT, msgpack.packb([ref.index, dtype, list(shape), kind]))

    def _array(self, a: np.ndarray, kind: str) -> msgpack.ExtType:
        name = a.dtype.name
        if name not in _NP_OF:
            raise TypeError(f"array dtype {a.dtype} cannot travel (wire dtypes: {', '.join(sorted(_ITEMSIZE))})")
        if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and not _LITTLE):
            a = a.astype(a.dtype.newbyteorder("<"))
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        return self._add(_flat_bytes(a), name, a.shape, kind, a.nbytes)

    def _tensor(self, t, torch) -> msgpack.ExtType:
        if t.device.type != "cpu":
            if not self.host_copy:
                raise TypeError(f"a {t.device.type} tensor cannot travel in a message: call .cpu() first or send "
                                "with host_copy=True to ask for an explicit device-to-host copy")
            t = t.detach().to("cpu")
        t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        name = str(t.dtype).removeprefix("torch.")
        if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            raw = t.view(torch.int16 if name == "bfloat16" else torch.uint8).numpy()
            return self._add(_flat_bytes(raw), name, tuple(t.shape), "torch", raw.nbytes)
        if name not in _NP_OF:
            raise TypeError(f"tensor dtype {t.dtype} cannot travel (wire dtypes: {', '.join(sorted(_ITEMSIZE))})")
        a = t.numpy()
        return self._add(_flat_bytes(a), name, tuple(t.shape), "torch", a.nbytes)


def _flat_bytes(a: np.ndarray) -> memoryview:
    """A 1-D byte view of a C-contiguous array (no copy), so len() is its size in bytes."""
    return a.reshape(-1).view(np.uint8).data


class BodyEncoder:
    """Reusable body encoder (one per mailbox; not thread-safe): a kept msgpack Packer is ~3x faster than packb."""

    def __init__(self):
        self._enc = _Encoder(False)
        self._packer = msgpack.Packer(default=self._enc.default, use_bin_type=True, datetime=False)

    def encode(self, body: Any, host_copy: bool = False) -> tuple[bytes, list, list[ArrayRef]]:
        if body is None:
            return b"\xc0", [], []
        enc = self._enc
        enc.buffers, enc.refs, enc.host_copy = [], [], host_copy
        try:
            packed = self._packer.pack(body)
        except (TypeError, ValueError, OverflowError) as exc:
            self._packer = msgpack.Packer(default=enc.default, use_bin_type=True, datetime=False)
            raise TypeError(f"message body cannot be encoded: {exc}") from None
        return packed, enc.buffers, enc.refs


def encode_body(body: Any, host_copy: bool = False) -> tuple[bytes, list, list[ArrayRef]]:
    """Encode a body: (msgpack bytes, array buffers to send as frames, array refs for the trace)."""
    if body is None:
        return b"\xc0", [], []
    enc = _Encoder(host_copy)
    try:
        packed = msgpack.packb(body, default=enc.default, use_bin_type=True, datetime=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"message body cannot be encoded: {exc}") from None
    return packed, enc.buffers, enc.refs


def _check_ref(data: bytes, frames: list) -> tuple[int, str, tuple, str]:
    try:
        ref = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise ProtocolError(f"array reference is not msgpack: {exc}") from None
    if (not isinstance(ref, list) or len(ref) != 4 or not isinstance(ref[0], int) or not isinstance(ref[1], str)
            or not isinstance(ref[2], list) or not isinstance(ref[3], str)):
        raise ProtocolError(f"array reference must be [frame_index, dtype, shape, kind], got {ref!r:.200}")
    index, dtype, shape, kind = ref
    if not 0 <= index < len(frames):
        raise ProtocolError(f"array reference to frame {index}, but the message has {len(frames)} array frame(s)")
    if dtype not in _ITEMSIZE:
        raise ProtocolError(f"unknown array dtype {dtype!r}")
    if kind not in ("numpy", "torch"):
        raise ProtocolError(f"unknown array kind {kind!r} (numpy or torch)")
    n = 1
    for d in shape:
        if not isinstance(d, int) or d < 0:
            raise ProtocolError(f"bad array shape {shape!r:.200}")
        n *= d
    size = len(frames[index])
    if n * _ITEMSIZE[dtype] != size:
        raise ProtocolError(f"array frame {index} has {size} bytes, but {dtype}{list(shape)} needs "
                            f"{n * _ITEMSIZE[dtype]}")
    return index, dtype, tuple(shape), kind


def frame_buffer(frame) -> memoryview:
    """The memory of a received frame (a zmq Frame, or bytes for a copied one)."""
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def _make_array(frame, dtype: str, shape: tuple, kind: str):
    buf = frame_buffer(frame)
    if kind == "torch":
        torch = _torch()
        if torch is None:
            import torch  # noqa: F811 -- the sender sent a tensor; the receiver gets one
        if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            raw = np.frombuffer(buf, dtype=np.int16 if dtype == "bfloat16" else np.uint8)
            return _as_tensor(torch, raw).view(getattr(torch, dtype)).reshape(shape)
        return _as_tensor(torch, np.frombuffer(buf, dtype=_NP_OF[dtype])).reshape(shape)
    if dtype not in _NP_OF:
        raise ProtocolError(f"dtype {dtype} can only travel as a torch tensor")
    # read-only (as Ray's zero-copy arrays are: .copy() to change one), so that an array passed on unchanged is
    # known to be unchanged without reading it (mailbox/checksums.py)
    return np.frombuffer(buf.toreadonly(), dtype=_NP_OF[dtype]).reshape(shape)


def _as_tensor(torch, a: np.ndarray):
    # The tensor keeps the frame alive. Writing into it is allowed (nobody else reads that memory); torch warns
    # about a read-only buffer (a frame received as bytes) once per process.
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def _no_frames_hook(code: int, payload: bytes):
    if code != ARRAY_EXT:
        raise ProtocolError(f"unknown msgpack ext type {code} in body (only {ARRAY_EXT}, arrays, is defined)")
    _check_ref(payload, ())  # raises: there is no frame to refer to
    raise ProtocolError("array reference without array frames")  # not reached


# msgpack decodes ext type -1 (timestamps) itself, without asking ext_hook, so a decoded body is checked for Timestamp
# objects -- unless its bytes hold no timestamp's header (`_may_hold_timestamp`: where a 0xff byte is, numpy looks
# at the bytes before it; for a get_work reply of 16 chat groups, 35 us against 300 for the check). The check
# walks containers, not items: a list of numbers (token ids, log-probs) is summed in C (a Timestamp, a string, a
# container or None in it makes `sum` raise; only then are its item types collected), a map's value types are
# collected in C, and only the containers in it are walked. bench/rl_bodies.py measures it.


_EXT_LENGTHS = (4, 8, 12)   # the lengths msgpack decodes an ext of type -1 (0xff) of as a Timestamp
# Bodies this large or larger are screened first; a smaller one is checked at once (the screen's ~20 us of numpy calls
# cost about what the check of a 10-30 KB body of samples does: bench/rl_bodies.py).
SCREEN_FROM = 16384


def _may_hold_timestamp(data: bytes) -> bool:
    """Whether `data` holds the header of an ext type -1 of a timestamp's length anywhere: fixext 4 or 8 (d6 ff, d7 ff),
    ext 8 (c7 LL ff), ext 16 (c8 00 LL ff) or ext 32 (c9 00 00 00 LL ff), LL one of 4, 8, 12 -- byte patterns, not
    decoded items, so it may say True where there is none (then the decoded body is checked), never False where
    there is one."""
    a = np.frombuffer(data, dtype=np.uint8)
    at = np.flatnonzero(a[1:] == 0xFF)          # each 0xff's position less one: the byte before it
    if not at.size:
        return False
    before = a[at]
    if np.isin(before, (0xD6, 0xD7)).any():
        return True
    at = at[np.isin(before, _EXT_LENGTHS)]      # an ext's length byte before the 0xff: ext 8, 16 or 32?
    if not at.size:
        return False
    padded = np.concatenate((np.zeros(4, np.uint8), a))   # (positions shifted by 4: no negative index)
    b2, b3, b4, b5 = (padded[at + 4 - k] for k in (1, 2, 3, 4))
    return bool(((b2 == 0xC7) | ((b2 == 0) & (b3 == 0xC8)) |
                 ((b2 == 0) & (b3 == 0) & (b4 == 0) & (b5 == 0xC9))).any())


def _reject_timestamps(obj, depth: int = 0, numbers_fast: bool = True) -> None:
    """Raise ProtocolError if a Timestamp is anywhere in a decoded body. `numbers_fast`: a list is first summed in C
    (~3 ns an item, against ~14 to collect its item types and ~60 for a regular expression over its bytes); off where
    the body holds arrays (an ndarray takes part in a sum, at the cost of its size). A map's keys are strings or bytes
    (strict_map_key: msgpack refuses a timestamp there itself), so only its values are looked at."""
    t = type(obj)
    if t is dict:
        items = obj.values()
        kinds = set(map(type, items))
    elif t is list:
        if numbers_fast:
            try:
                sum(obj)   # ints, floats and booleans only: nothing else adds to a number
                return
            except Exception:  # noqa: BLE001 - (a TypeError; anything else means the same: look closer)
                pass
        items = obj
        kinds = set(map(type, obj))
    elif t is msgpack.Timestamp:
        raise ProtocolError(f"unknown msgpack ext type -1 in body (only {ARRAY_EXT}, arrays, is defined)")
    else:
        return
    if msgpack.Timestamp in kinds:
        raise ProtocolError(f"unknown msgpack ext type -1 in body (only {ARRAY_EXT}, arrays, is defined)")
    if depth < 512 and (dict in kinds or list in kinds):   # (only then: a flat map or list allocates nothing more)
        for v in items:
            if type(v) is dict or type(v) is list:
                _reject_timestamps(v, depth + 1, numbers_fast)


def decode_body(data, frames: list) -> Any:
    """Decode a body, resolving array references against the out-of-band frames. Raises ProtocolError."""
    if not frames:
        if data == b"\xc0":
            return None
        hook = _no_frames_hook
    else:
        def hook(code: int, payload: bytes):
            if code != ARRAY_EXT:
                raise ProtocolError(f"unknown msgpack ext type {code} in body (only {ARRAY_EXT}, arrays, is defined)")
            index, dtype, shape, kind = _check_ref(payload, frames)
            return _make_array(frames[index], dtype, shape, kind)
    try:
        body = _unpackb(data, ext_hook=hook)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several types for bad input; all mean the same to us
        raise ProtocolError(f"body is not valid msgpack: {type(exc).__name__}: {exc}") from None
    if type(data) is not bytes or (b"\xff" in data and (len(data) < SCREEN_FROM or _may_hold_timestamp(data))):
        _reject_timestamps(body, numbers_fast=not frames)
    return body


# ---------------------------------------------------------------------------------------------------- ids, headers

_PREFIX = os.urandom(4).hex()
_ids = itertools.count(1)
# Trace ids: 96 random bits per process, then a 32-bit counter -- unique across processes without a getrandom()
# syscall per trace (os.urandom costs ~1 us, a quarter of a header's encoding).
_TRACE_PREFIX = os.urandom(12).hex()
_traces = itertools.count(1)


def new_id() -> str:
    """A 16-hex-digit message id (a W3C span id): 8 random hex digits per process, then a counter."""
    return f"{_PREFIX}{next(_ids) & 0xFFFFFFFF:08x}"


def new_trace_id() -> str:
    """A 32-hex-digit W3C trace id: 24 random hex digits per process, then a counter."""
    return f"{_TRACE_PREFIX}{next(_traces) & 0xFFFFFFFF:08x}"


def traceparent(header: dict) -> str:
    """The W3C traceparent of a message: its trace id and its own id as the parent of whatever it causes."""
    return f"00-{header['trace']}-{header['id']}-01"


def header_v2(kind: str, sender: str, receiver: str, method: str, seq: int, trace: str, parent: str | None,
              deadline: float | None = None, idem: str | None = None, re: str | None = None) -> list:
    """A version-2 header (V2_FIELDS order) with a new message id at [2]; [13], nframes, is set when encoding."""
    return [2, kind, f"{_PREFIX}{next(_ids) & 0xFFFFFFFF:08x}", trace, sender, receiver, method, seq, _time(),
            parent, deadline, idem, re, 0]


def make_header(kind: str, sender: str, receiver: str, method: str, seq: int, trace: str, parent: str | None,
                deadline: float | None = None, idem: str | None = None, re: str | None = None) -> dict:
    """A version-1 header (a map): what is sent to a version-1 peer (its asks are answered in its version)."""
    h = header_v2(kind, sender, receiver, method, seq, trace, parent, deadline, idem, re)
    h[0] = 1
    return header_as_dict(h)


_time = time.time


def pack_header(h: dict | list) -> bytes:
    """Pack a header as it is: a map (version 1) or an array (version 2)."""
    return msgpack.packb(h, use_bin_type=True)


def header_as_dict(h) -> dict | None:
    """A decoded header of either version as a map, without validating it (for trace readers); None if neither."""
    if type(h) is dict:
        return h
    if type(h) is list and len(h) >= V2_LEN:
        out = dict(zip(V2_FIELDS, h))
        for key in ("parent", "deadline", "idem", "re"):
            if out[key] is None:
                del out[key]
        if not out["nframes"]:
            del out["nframes"]
        return out
    return None


_REQUEST_SET = frozenset(("tell", "ask", "hb"))
_RESPONSE_SET = frozenset(RESPONSE_KINDS)


def decode_header(data) -> dict:
    """Decode and validate a header frame (version 2 array or version 1 map) into a map: the required fields and the
    optional ones that are set (nframes only when > 0). Raises ProtocolError naming what is wrong."""
    try:
        h = _unpackb(data)
    except Exception as exc:
        raise ProtocolError(f"header is not valid msgpack: {type(exc).__name__}: {exc}") from None
    if type(h) is list:
        return _decode_v2(h)
    # version 1, fast path: a well-formed header as this implementation writes it (exact types, known keys only)
    if type(h) is dict:
        g = h.get
        v = g("v")
        if (v == 1 and type(v) is int and type(g("id")) is str and type(g("trace")) is str
                and type(g("from")) is str and type(g("to")) is str and type(g("method")) is str
                and type(g("seq")) is int and type(g("ts")) is float and type(g("kind")) is str):
            kind = g("kind")
            n = len(h) - 9
            if n == 0:
                if kind in _REQUEST_SET:
                    return h
            else:
                re_ = g("re")
                if (kind in _REQUEST_SET and re_ is None) or (kind in _RESPONSE_SET and type(re_) is str):
                    if re_ is not None:
                        n -= 1
                    x = g("deadline")
                    if x is not None:
                        n -= 1 if type(x) is float else 99
                    x = g("parent")
                    if x is not None:
                        n -= 1 if type(x) is str else 99
                    if n > 0:
                        x = g("idem")
                        if x is not None:
                            n -= 1 if type(x) is str else 99
                        x = g("nframes")
                        if x is not None:
                            n -= 1 if type(x) is int and x >= 0 else 99
                    if n == 0:
                        return h
    return _decode_header_slow(h, 1)


def _decode_v2(a: list) -> dict:
    n = len(a)
    sums = None
    if n != V2_LEN:
        if n < V2_LEN:
            raise ProtocolError(f"a version 2 header is an array of {V2_LEN} fields ({', '.join(V2_FIELDS)}), "
                                f"got {n}")
        sums = a[SUMS_AT]
        a = a[:V2_LEN]  # and any fields a later version appended
    v, kind, mid, trace, frm, to, method, seq, ts, parent, dl, idem, re_, nf = a
    # fast path: exact types, as this implementation writes them
    if (v == 2 and type(v) is int and type(kind) is str and type(mid) is str and type(trace) is str
            and type(frm) is str and type(to) is str and type(method) is str and type(seq) is int
            and type(ts) is float and (parent is None or type(parent) is str) and (dl is None or type(dl) is float)
            and (idem is None or type(idem) is str) and (nf is None or (type(nf) is int and nf >= 0))
            and ((kind in _REQUEST_SET and re_ is None) or (kind in _RESPONSE_SET and type(re_) is str))):
        h = {"v": 2, "kind": kind, "id": mid, "trace": trace, "from": frm, "to": to, "method": method, "seq": seq,
             "ts": ts}
        if parent is not None:
            h["parent"] = parent
        if dl is not None:
            h["deadline"] = dl
        if idem is not None:
            h["idem"] = idem
        if re_ is not None:
            h["re"] = re_
        if nf:
            h["nframes"] = nf
        if sums is not None:
            h["sums"] = check_sums(sums, nf or 0)
        return h
    if type(v) is not int or v != 2:
        raise ProtocolError(f"an array header is protocol version 2, but its first field (the version) is {v!r}")
    m = dict(zip(V2_FIELDS, a))
    m = {k: x for k, x in m.items() if x is not None}
    if m.get("nframes") == 0:
        del m["nframes"]
    h = _decode_header_slow(m, 2)
    if sums is not None:
        h["sums"] = check_sums(sums, h.get("nframes", 0))
    return h


def _decode_header_slow(h, layout: int) -> dict:
    if not isinstance(h, dict):
        raise ProtocolError(f"header must be a msgpack array (version 2) or map (version 1), got {type(h).__name__}")
    v = h.get("v")
    if type(v) is not int or v not in SUPPORTED_VERSIONS:
        raise ProtocolError(f"protocol version {v!r} is not supported (supported: {list(SUPPORTED_VERSIONS)})")
    if v != layout:
        raise ProtocolError(f"a version {v} header is a msgpack {'array' if v == 2 else 'map'}, got a "
                            f"{'map' if layout == 1 else 'array'}")
    if layout == 1:
        h.pop("sums", None)  # a key version 1 does not define (ignored, as unknown keys are): only [14] of version 2
    for key, typ in REQUIRED_HEADER.items():
        val = h.get(key)
        if typ is float and isinstance(val, int) and not isinstance(val, bool):
            h[key] = val = float(val)
        if not isinstance(val, typ) or isinstance(val, bool):
            raise ProtocolError(f"header field {key!r} must be {typ.__name__}, got {type(val).__name__}")
    for key, typ in OPTIONAL_HEADER.items():
        val = h.get(key)
        if val is None:
            continue
        if typ is float and isinstance(val, int) and not isinstance(val, bool):
            h[key] = val = float(val)
        if not isinstance(val, typ) or isinstance(val, bool):
            raise ProtocolError(f"header field {key!r} must be {typ.__name__} or nil, got {type(val).__name__}")
    if h["kind"] not in KINDS:
        raise ProtocolError(f"unknown message kind {h['kind']!r} (kinds: {', '.join(KINDS)})")
    if h["kind"] in RESPONSE_KINDS and not h.get("re"):
        if h.get("re") != "":
            raise ProtocolError(f"a {h['kind']} must carry 're', the id of the ask it answers")
    if h.get("nframes") is not None and h["nframes"] < 0:
        raise ProtocolError("header field 'nframes' must be >= 0")
    return h
