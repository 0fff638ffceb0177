"""Fuzzing: malformed input never takes an actor down, never blows up its memory, and is counted.

* the codec: decode_header / decode_body raise only ProtocolError, whatever the bytes (random, msgpack of random
  values, truncated, wrong types, huge declared sizes, unknown ext types, absurd array references);
* a live actor in a child process: 10,000 messages built by hypothesis and sent with a raw pyzmq DEALER -- random
  frames, truncated headers, wrong header types, bad versions, wrong frame counts, huge declared sizes in header and
  body, unknown ext types, enormous array shapes, unknown methods, replies sent to a mailbox -- with good asks mixed
  in. Afterwards the actor answers a normal ask correctly, its process is alive, its memory did not grow, and the
  `_stats` counters (dropped, bad_requests, unknown_method, handled) account for every message sent.
"""

import os
import time
from collections import Counter

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import Echo, spawn_actor
from slime_actors.mailbox import codec
from slime_actors.mailbox.codec import ProtocolError
from slime_actors.runtime import RuntimeConfig

N_LIVE = 10_000
BATCH = 10  # messages per hypothesis example: the live test runs N_LIVE / BATCH examples
FAST = settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))

# msgpack headers that declare ~4 GiB (str32, bin32, array32, map32, ext32) or 2^32-1 elements
HUGE = [b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff",
        b"\xc9\xff\xff\xff\xff\x01", b"\xc9\xff\xff\xff\xff\xff", b"\xdb\x7f\xff\xff\xff", b"\xdd\x10\x00\x00\x00"]

plain = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=True) | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
ext = st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=16))
array_ref = st.builds(
    lambda i, dt, shape, kind: msgpack.ExtType(1, msgpack.packb([i, dt, shape, kind])),
    st.integers(-2, 3) | st.just(2**63 - 1), st.sampled_from(["float32", "int64", "bfloat16", "bool", "float99", ""]),
    st.lists(st.integers(-1, 2**62) | st.just(2**40), max_size=6), st.sampled_from(["numpy", "torch", "pickle"]))
weird = st.recursive(plain | ext | array_ref,
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=10)


def good_header(**over) -> dict:
    h = {"v": 1, "kind": "ask", "id": os.urandom(8).hex(), "trace": os.urandom(16).hex(), "from": "fuzz/0",
         "to": "echo/1", "method": "echo", "seq": 1, "ts": time.time()}
    h.update(over)
    return h


def packb(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def body_with_ext(code: int, payload: bytes) -> bytes:
    """{"x": [ext(code, payload)]} by hand: msgpack.ExtType refuses negative codes, the wire does not."""
    return b"\x81\xa1x\x91\xc7" + bytes([len(payload), code & 0xFF]) + payload


# ------------------------------------------------------------------------------------------------ codec, directly
def assert_only_protocol_errors(fn, *args):
    try:
        fn(*args)
    except ProtocolError:
        pass  # any other exception fails the test


@FAST
@given(st.binary(max_size=300))
def test_decode_header_random_bytes(data):
    assert_only_protocol_errors(codec.decode_header, data)


@FAST
@given(weird)
def test_decode_header_random_values(value):
    assert_only_protocol_errors(codec.decode_header, packb(value))


WRONG = {str: st.integers(-2**63, 2**64 - 1) | st.floats() | st.none() | st.binary(max_size=4) | st.booleans() | st.lists(st.integers(0, 9),
                                                                                                         max_size=2),
         int: st.text(max_size=3) | st.floats() | st.none() | st.booleans() | st.binary(max_size=3),
         float: st.text(max_size=3) | st.none() | st.booleans() | st.binary(max_size=3) | st.lists(st.none(), max_size=2)}


@st.composite
def header_with_a_wrong_field(draw):
    fields = dict(codec.REQUIRED_HEADER, **{k: t for k, t in codec.OPTIONAL_HEADER.items() if k != "nframes"})
    key = draw(st.sampled_from(sorted(fields)))
    value = draw(WRONG[fields[key]].filter(lambda v: v is not None or key in codec.REQUIRED_HEADER))
    return key, value


@FAST
@given(header_with_a_wrong_field())
def test_decode_header_rejects_wrong_field_types(kv):
    key, value = kv
    with pytest.raises(ProtocolError, match="must be|not supported|unknown message kind"):
        codec.decode_header(packb(good_header(**{key: value})))


@FAST
@given(header_with_a_wrong_field())
def test_decode_header_rejects_wrong_field_types_in_a_version_2_array(kv):
    key, value = kv
    h = codec.header_v2("ask", "a/0", "b/0", "m", 1, codec.new_trace_id(), None, deadline=1.0)
    h[codec.V2_FIELDS.index(key)] = value
    with pytest.raises(ProtocolError, match="must be|not supported|unknown message kind|the version"):
        codec.decode_header(packb(h))


@FAST
@given(st.lists(weird, min_size=14, max_size=16))
def test_decode_header_random_arrays(values):
    assert_only_protocol_errors(codec.decode_header, packb([2] + values[1:]))


@FAST
@given(st.integers(0, 200), st.sampled_from(HUGE), st.binary(max_size=32))
def test_huge_declared_sizes_are_refused_without_allocating(cut, huge, tail):
    h = packb(good_header())
    for data in (huge + tail, h[: min(cut, len(h) - 1)], packb({"x": 1})[:-1] + huge):
        with pytest.raises(ProtocolError):
            codec.decode_header(data)
    with pytest.raises(ProtocolError):
        codec.decode_body(b"\x81\xa1x" + huge + tail, [])
    with pytest.raises(ProtocolError):
        codec.decode_body(huge + tail, [b"\0" * 8])


@FAST
@given(st.binary(max_size=300), st.lists(st.binary(max_size=64), max_size=3))
def test_decode_body_random_bytes(data, frames):
    assert_only_protocol_errors(codec.decode_body, data, frames)


@FAST
@given(weird, st.lists(st.binary(max_size=64), max_size=3))
def test_decode_body_random_values(value, frames):
    assert_only_protocol_errors(codec.decode_body, packb(value), frames)


@FAST
@given(st.integers(-128, 127).filter(lambda c: c != 1), st.binary(max_size=20))
def test_unknown_ext_types_are_protocol_errors(code, payload):
    with pytest.raises(ProtocolError, match="unknown msgpack ext type|not valid msgpack"):
        codec.decode_body(body_with_ext(code, payload), [])


def test_timestamps_are_not_a_way_around_the_ext_rule():
    for ts in (msgpack.Timestamp(1, 0), msgpack.Timestamp(1, 5), msgpack.Timestamp(2**40, 5)):
        with pytest.raises(ProtocolError, match="ext type -1"):
            codec.decode_body(packb({"x": [1, {"t": ts}]}), [])
    for raw in (b"\xc7\x04\xff" + b"\0" * 4, b"\xc8\x00\x08\xff" + b"\0" * 8, b"\xc9\x00\x00\x00\x0c\xff" + b"\0" * 12):
        with pytest.raises(ProtocolError, match="ext type -1"):  # the same timestamps, in the longer ext forms
            codec.decode_body(b"\x81\xa1x" + raw, [])
    assert codec.decode_body(packb({"x": b"\xd6\xff\xd7\xff"}), []) == {"x": b"\xd6\xff\xd7\xff"}
    # wherever it sits: among ten thousand numbers, deep in lists of maps, as a map key (msgpack refuses that one
    # itself); the check collects each container's item types at once and walks only the containers in it
    ts = msgpack.Timestamp(1, 0)
    for body in ({"tokens": [[*range(5000), ts, *range(5000)]]}, {"a": [{"b": [[1.5, {"c": [ts]}]]}]},
                 [[0.25] * 100, [ts]], {"k": {ts: 1}}):
        with pytest.raises(ProtocolError, match="ext type -1|not allowed for map key"):
            codec.decode_body(packb(body), [])
    clean = {"tokens": [[*range(5000)], [0.5] * 100], "m": {"k": [None, True, "s", b"b", {"n": [1, 2]}]}}
    assert codec.decode_body(packb(clean), []) == clean


TIMESTAMP_HEADERS = [bytes([0xD6, 0xFF]), bytes([0xD7, 0xFF])] + [
    head + bytes([n, 0xFF]) for n in (4, 8, 12) for head in (b"\xc7", b"\xc8\x00", b"\xc9\x00\x00\x00")]


@FAST
@given(st.binary(max_size=300), st.sampled_from(TIMESTAMP_HEADERS), st.binary(max_size=300))
def test_the_screen_before_the_timestamp_check_never_misses_a_timestamp_header(before, header, after):
    """The decoded body is checked for timestamps only where its bytes may hold one (codec._may_hold_timestamp): any
    of a timestamp's headers -- fixext 4 and 8, ext 8, 16 and 32 of length 4, 8 or 12 -- anywhere, among any bytes,
    says it may."""
    assert codec._may_hold_timestamp(before + header + after)


def test_a_body_with_0xff_bytes_but_no_timestamp_header_is_not_walked(monkeypatch):
    """Token ids and log-probs hold 0xff bytes almost always; the walk over the decoded body (for a get_work
    reply of 16 chat groups on a 2-vCPU VM, 300 us) runs only when a timestamp's header is among them."""
    walked = []
    real = codec._reject_timestamps
    monkeypatch.setattr(codec, "_reject_timestamps", lambda obj, *a, **k: walked.append(1) or real(obj, *a, **k))
    body = packb({"groups": [{"prompt_tokens": [255, 511, 0xFFFF, 0x1FF], "label": "x\xff"}] * 1000})
    assert b"\xff" in body and len(body) >= codec.SCREEN_FROM and not codec._may_hold_timestamp(body)
    assert codec.decode_body(body, [])["groups"][0]["prompt_tokens"][2] == 0xFFFF and not walked
    with pytest.raises(ProtocolError, match="ext type -1"):
        codec.decode_body(packb({"groups": [{"t": msgpack.Timestamp(3, 0)}, *[{"n": [1, 2, 3]}] * 5000]}), [])
    assert walked


def test_a_timestamp_among_numbers_is_found_however_the_list_is_checked():
    """A list of numbers is summed in C (nothing but a number adds to one); a timestamp anywhere in it -- first, last,
    after ten thousand log-probs, beside booleans -- makes the sum fail and the list is looked at closely. With arrays
    in the body the sum is not used (an array takes part in it), and the timestamp is found all the same."""
    ts = msgpack.Timestamp(7, 0)
    for lst in ([ts, 1, 2], [0.5] * 10_000 + [ts], [*range(3000), True, ts], [2**63, -1.5, ts], [ts]):
        with pytest.raises(ProtocolError, match="ext type -1"):
            codec.decode_body(packb({"log_probs": lst}), [])
    numbers = {"log_probs": [-0.25] * 10_000, "tokens": [*range(0, 2**20, 97)], "flags": [True, False, 0, 2**64 - 1]}
    assert codec.decode_body(packb(numbers), []) == numbers
    body, buffers, _ = codec.encode_body({"a": np.arange(4, dtype=np.float32), "x": [1.5, 2, ts]})
    with pytest.raises(ProtocolError, match="ext type -1"):
        codec.decode_body(body, [bytes(b) for b in buffers])


@FAST
@given(st.lists(st.integers(0, 2**62) | st.just(2**40), min_size=1, max_size=8),
       st.sampled_from(["float32", "int8", "bfloat16"]))
def test_enormous_array_shapes_are_refused(shape, dtype):
    body = packb({"x": msgpack.ExtType(1, packb([0, dtype, shape, "torch"]))})
    n = 1
    for d in shape:
        n *= d
    if n * {"float32": 4, "int8": 1, "bfloat16": 2}[dtype] == 16:
        return
    with pytest.raises(ProtocolError, match="needs|bad array shape"):
        codec.decode_body(body, [b"\0" * 16])


# ------------------------------------------------------------------------------------------------ a live actor
def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


DROPPED = ("garbage", "truncated_header", "wrong_type", "bad_version", "frame_count", "reply_kind", "huge_header")
BAD_REQUEST = ("huge_body", "bad_body", "truncated_body", "unknown_ext", "huge_shape")


@st.composite
def fuzz_message(draw):
    """(category, frames): what the actor must do with it is known from the category."""
    cat = draw(st.sampled_from(DROPPED + BAD_REQUEST + ("unknown_method", "valid")))
    kind = draw(st.sampled_from(["ask", "tell"]))
    seq = draw(st.integers(0, 2**63 - 1))
    body = packb({"x": 1})
    if cat == "garbage":
        frames = draw(st.lists(st.binary(max_size=48), min_size=1, max_size=4))
        if len(frames) >= 2 and frames[0][:1] in (b"\x89", b"\x8a", b"\x8b", b"\x8c", b"\x8d", b"\x8e", b"\x8f",
                                                   b"\xde", b"\xdf"):
            frames[0] = b"\xc1" + frames[0]  # a map this long could (absurdly unlikely) be a header: keep it garbage
        return cat, frames
    if cat == "truncated_header":
        h = packb(good_header(kind=kind, seq=seq))
        return cat, [h[: draw(st.integers(0, len(h) - 1))], body]
    if cat == "wrong_type":
        key, value = draw(header_with_a_wrong_field())
        h = good_header(kind=kind, seq=seq)
        h[key] = value
        return cat, [packb(h), body]
    if cat == "bad_version":
        v = draw(st.sampled_from([0, 2, -1, 99, 2**40, "1", 1.0, True, None, [1]]))
        return cat, [packb(good_header(kind=kind, v=v)), body]
    if cat == "frame_count":
        n = draw(st.integers(0, 3))
        extra = draw(st.integers(0, 4).filter(lambda k: k != n))
        h = good_header(kind=kind, nframes=n) if n else good_header(kind=kind)
        if draw(st.booleans()):
            return cat, [packb(h)]  # no body frame at all
        return cat, [packb(h), body] + [b"\0" * 4] * extra
    if cat == "reply_kind":
        return cat, [packb(good_header(kind=draw(st.sampled_from(["reply", "error"])), re="0" * 16)), body]
    if cat == "huge_header":
        return cat, [draw(st.sampled_from(HUGE)) + draw(st.binary(max_size=16)), body]
    h = good_header(kind=kind, seq=seq)
    if cat == "huge_body":
        return cat, [packb(h), b"\x81\xa1x" + draw(st.sampled_from(HUGE)) + draw(st.binary(max_size=16))]
    if cat == "bad_body":
        return cat, [packb(h), b"\xc1" + draw(st.binary(max_size=32))]
    if cat == "truncated_body":
        b = packb({"x": draw(plain)})
        return cat, [packb(h), b[: draw(st.integers(0, len(b) - 1))]]
    if cat == "unknown_ext":
        code = draw(st.integers(2, 127) | st.integers(-128, -2) | st.just(0))
        return cat, [packb(h), body_with_ext(code, draw(st.binary(max_size=8)))]
    if cat == "huge_shape":
        shape = draw(st.lists(st.integers(2**20, 2**62), min_size=1, max_size=4))
        ref = msgpack.ExtType(1, packb([0, "float32", shape, "numpy"]))
        h["nframes"] = 1
        return cat, [packb(h), packb({"x": ref}), b"\0" * 16]
    if cat == "unknown_method":
        h["method"] = "zz_" + draw(st.text(max_size=10))
        return cat, [packb(h), body]
    x = draw(plain)
    return cat, [packb(dict(h, kind="ask")), packb({"x": x})]


@pytest.fixture(scope="module")
def fuzzed_actor(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("fuzz"))
    p = spawn_actor(Echo, 1, RuntimeConfig(run_dir=run_dir, curve=False))
    d = os.path.join(run_dir, "sockets")
    (sock,) = [f for f in os.listdir(d) if f.startswith("echo-1.")]
    yield p, f"ipc://{os.path.join(d, sock)}"
    p.kill()
    p.join()


def _ask(s, method, body=None):
    h = good_header(method=method)
    s.send_multipart([packb(h), packb(body)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        frames = s.recv_multipart()
        rh = msgpack.unpackb(frames[0])
        if rh.get("re") == h["id"]:
            return rh, msgpack.unpackb(frames[1])
    raise AssertionError(f"no reply to {method}")


def test_live_actor_survives_and_counts_10000_fuzzed_messages(fuzzed_actor):
    proc, endpoint = fuzzed_actor
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    s.rcvtimeo = 10_000
    s.sndtimeo = 10_000
    s.connect(endpoint)
    try:
        _, before = _ask(s, "_stats")
        rss0 = _rss(proc.pid)
        sent: Counter = Counter()
        replies = {"n": 0, "errors_re_empty": 0}

        def drain():
            while True:
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return
                h = codec.decode_header(frames[0])  # whatever comes back is a valid envelope
                assert h["kind"] in ("reply", "error") and h["from"] == "echo/1"
                replies["n"] += 1
                replies["errors_re_empty"] += h["kind"] == "error" and h["re"] == ""

        @settings(max_examples=N_LIVE // BATCH, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(fuzz_message(), min_size=BATCH, max_size=BATCH))
        def send(batch):
            for cat, frames in batch:
                s.send_multipart(frames)
                sent[cat] += 1
            if sum(sent.values()) % 200 == 0:
                drain()

        t0 = time.monotonic()
        send()
        total = sum(sent.values())
        assert total >= N_LIVE, f"hypothesis ran only {total} examples"
        assert all(sent[c] > 100 for c in DROPPED + BAD_REQUEST + ("unknown_method", "valid")), sent

        # still answering, correctly, and alive
        rh, out = _ask(s, "echo", {"x": {"still": ["here", 1.5]}})
        assert rh["kind"] == "reply" and out == {"still": ["here", 1.5]}
        assert proc.is_alive()
        _, after = _ask(s, "_stats")
        drain()
        grew = (_rss(proc.pid) - rss0) / 2**20
        assert grew < 64, f"actor memory grew {grew:.0f} MiB while fuzzed"

        delta = {k: after[k] - before[k] for k in after if isinstance(after[k], int) and k in before}
        dropped = sum(sent[c] for c in DROPPED)
        assert delta["mailbox_dropped"] == dropped, (delta, sent)
        assert delta["bad_requests"] == sum(sent[c] for c in BAD_REQUEST), (delta, sent)
        assert delta["unknown_method"] == sent["unknown_method"]
        assert delta["handled"] == sent["valid"] + 2  # + the echo and the first _stats ask above
        assert delta["failed"] == 0 and delta["expired"] == 0
        # every message reached the mailbox and was either taken in or dropped
        assert delta["mailbox_received"] + delta["mailbox_dropped"] == total + 2
        assert replies["errors_re_empty"] >= dropped * 0.99  # best effort; on one host none is lost
        print(f"\n{total} fuzzed messages in {time.monotonic() - t0:.1f}s: {dict(sent)}; "
              f"{replies['n']} answers; rss +{grew:.1f} MiB")
    finally:
        s.close()
