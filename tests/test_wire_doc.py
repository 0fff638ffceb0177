"""docs/wire-format.md is precise enough to talk to an actor: messages built by hand from it get the documented answers.

Everything sent here is built with raw pyzmq + msgpack (+ numpy for the array bytes) from what the document says --
its hex dump, its key table, its ext-type layout. slime_actors is imported only to run the actor being talked to and
to compare the document's method table with the declared catalog.
"""

import json
import os
import re
import struct
import time

import msgpack
import numpy as np
import pytest
import xxhash
import zmq

from helpers import Echo, spawn_actor
from slime_actors.runtime import RuntimeConfig

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "wire-format.md")
HEX = re.compile(r"^(?:[0-9a-f]{2} )*[0-9a-f]{2}$")


def doc_text() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```\n(.*?)```", text, flags=re.S)


def frames_from_hex(block: str) -> list[bytes]:
    """A code block of 'frame N' lines followed by hex lines -> the frames' bytes."""
    frames: list[bytearray] = []
    for line in block.splitlines():
        line = line.strip()
        if line.startswith("frame "):
            frames.append(bytearray())
        elif HEX.match(line):
            frames[-1] += bytes.fromhex(line)
    return [bytes(f) for f in frames]


def json_views(block: str) -> list:
    """A code block of 'frame N (...)' lines followed by JSON -> the decoded values."""
    parts, cur = [], None
    for line in block.splitlines():
        if line.startswith("frame "):
            if cur is not None:
                parts.append(cur)
            cur = ""
        else:
            cur += re.sub(r"\s{2,}\([0-9a-f ]+\)$", "", line) + "\n"  # "(a2 68 69)": the bytes, as a note
    parts.append(cur)
    return [json.loads(p) for p in parts]


@pytest.fixture(scope="module")
def echo_endpoint(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("wire"))
    p = spawn_actor(Echo, 1, RuntimeConfig(run_dir=run_dir, curve=False))
    d = os.path.join(run_dir, "sockets")
    (sock,) = [f for f in os.listdir(d) if f.startswith("echo-1.")]
    yield f"ipc://{os.path.join(d, sock)}"
    p.kill()
    p.join()


@pytest.fixture
def dealer(echo_endpoint):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    s.rcvtimeo = 5000
    s.connect(echo_endpoint)
    yield s
    s.close()


REQUIRED = {"v": int, "kind": str, "id": str, "trace": str, "from": str, "to": str, "method": str, "seq": int,
            "ts": float}


def header_fields() -> list[str]:
    """The version 2 header's field names in order, read from the document's header table."""
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", section(doc_text(), "Header"), flags=re.M)
    assert [int(i) for i, _ in rows] == list(range(len(rows)))
    return [name for _, name in rows]


def as_map(h) -> dict:
    """A received header as a map: version 2's array by the document's positions (nil = not set), a map as is."""
    if isinstance(h, list):
        return {k: x for k, x in zip(header_fields(), h) if x is not None}
    return h


def check_header(h: dict, version: int) -> None:
    """What the document's header table promises about every header."""
    for key, typ in REQUIRED.items():
        assert type(h[key]) is typ, (key, h)
    assert h["v"] == version
    assert re.fullmatch(r"[0-9a-f]{16}", h["id"]) and re.fullmatch(r"[0-9a-f]{32}", h["trace"])
    assert h["kind"] in ("tell", "ask", "reply", "error", "hb")
    if h["kind"] in ("reply", "error"):
        assert type(h["re"]) is str


def test_the_header_table_lists_the_fields_in_order():
    assert header_fields() == ["v", "kind", "id", "trace", "from", "to", "method", "seq", "ts", "parent",
                               "deadline", "idem", "re", "nframes", "sums"]


def test_worked_example_bytes_match_the_json_view_and_get_the_documented_reply(dealer):
    ex = section(doc_text(), "Worked example: an ask and its reply")
    blocks = code_blocks(ex)
    view = json_views(blocks[0])
    frames = frames_from_hex(blocks[1])
    assert len(frames) == 2
    # the hex dump is the JSON view, byte for byte as documented (header 93 bytes, body 6 bytes)
    assert [msgpack.unpackb(f) for f in frames] == view
    assert (len(frames[0]), len(frames[1])) == (93, 6)
    ask = as_map(view[0])

    dealer.send_multipart(frames)
    reply = dealer.recv_multipart()
    assert len(reply) == 2
    raw_h, body = msgpack.unpackb(reply[0]), msgpack.unpackb(reply[1])
    assert isinstance(raw_h, list) and len(raw_h) == 14  # a version-2 ask is answered in version 2
    h = as_map(raw_h)
    check_header(h, 2)
    documented = as_map(json_views(blocks[2])[0])
    for key in ("v", "kind", "trace", "from", "to", "method", "parent", "re"):
        assert h[key] == documented[key], key
    assert h["re"] == h["parent"] == ask["id"] and h["trace"] == ask["trace"]
    assert body == json_views(blocks[2])[1] == "hi"
    assert h["nframes"] == 0 and "deadline" not in h and "idem" not in h


def test_a_version_1_ask_is_answered_in_version_1(dealer):
    """The document's version-1 map: the same ask as a map gets a map back."""
    ask = as_map(json_views(code_blocks(section(doc_text(), "Worked example: an ask and its reply"))[0])[0])
    ask = dict(ask, v=1, id=os.urandom(8).hex())
    del ask["nframes"]  # absent = 0 in a map
    dealer.send_multipart([msgpack.packb(ask), msgpack.packb({"x": "hi"})])
    reply = dealer.recv_multipart()
    h = msgpack.unpackb(reply[0])
    assert isinstance(h, dict)
    check_header(h, 1)
    assert h["kind"] == "reply" and h["re"] == h["parent"] == ask["id"] and msgpack.unpackb(reply[1]) == "hi"
    assert "nframes" not in h


def handmade_header(**over) -> dict:
    h = {"v": 1, "kind": "ask", "id": os.urandom(8).hex(), "trace": os.urandom(16).hex(), "from": "handmade/0",
         "to": "echo/1", "method": "echo", "seq": 1, "ts": time.time()}
    h.update(over)
    return h


def handmade_v2(**over) -> list:
    fields = header_fields()
    h = [None] * len(fields)
    for k, x in dict(handmade_header(v=2, nframes=0), **over).items():
        h[fields.index(k)] = x
    return h


def test_handmade_ask_with_deadline_and_an_array(dealer):
    """The array layout: ext type 1 with [frame_index, dtype, shape, kind], raw little-endian C-order frame."""
    a = np.arange(12, dtype="<f4").reshape(3, 4) * 0.5
    ref = msgpack.ExtType(1, msgpack.packb([0, "float32", [3, 4], "numpy"]))
    h = handmade_v2(deadline=time.time() + 30, nframes=1, seq=7)
    dealer.send_multipart([msgpack.packb(h), msgpack.packb({"x": {"a": ref, "tag": "t"}}), a.tobytes()])
    reply = dealer.recv_multipart()
    rh = as_map(msgpack.unpackb(reply[0]))
    check_header(rh, 2)
    assert rh["kind"] == "reply" and rh["re"] == as_map(h)["id"] and rh["nframes"] == 1 and len(reply) == 3
    refs = []
    body = msgpack.unpackb(reply[1], ext_hook=lambda code, data: refs.append((code, msgpack.unpackb(data))) or "ref")
    assert body == {"a": "ref", "tag": "t"}
    assert refs == [(1, [0, "float32", [3, 4], "numpy"])]
    assert reply[2] == a.tobytes()
    # the echo traces (the default): its reply declares the frame's XXH3-64 (field 14, "Array checksums")
    assert rh["sums"] == [xxhash.xxh3_64_hexdigest(a.tobytes())]

    # the document's own array example: 3 float32 values, 12 bytes (here in a version-1 header: same layout)
    ex = section(doc_text(), "Worked example: an ask and its reply")
    arr_section = ex[ex.index("### With an array"):]
    body_hex, = [b for b in code_blocks(arr_section)]
    body_bytes = bytes.fromhex(" ".join(l for l in body_hex.splitlines() if HEX.match(l.strip())))
    frame_hex = re.search(r"frame 2 holds the 12 bytes `([0-9a-f ]+)`", arr_section).group(1)
    frame = bytes.fromhex(frame_hex)
    assert struct.unpack("<3f", frame) == (1.5, -2.0, 3.25)
    h = handmade_header(nframes=1)
    dealer.send_multipart([msgpack.packb(h), body_bytes, frame])
    reply = dealer.recv_multipart()
    assert msgpack.unpackb(reply[0])["kind"] == "reply" and reply[2] == frame
    # in version 2 the traced echo's reply declares the checksum the document gives
    doc_sum = re.search(r'`sums`,\s+`\["([0-9a-f]{16})"\]`', arr_section).group(1)
    dealer.send_multipart([msgpack.packb(handmade_v2(nframes=1, seq=8)), body_bytes, frame])
    reply = dealer.recv_multipart()
    assert as_map(msgpack.unpackb(reply[0]))["sums"] == [doc_sum] and reply[2] == frame


@pytest.mark.parametrize("frames,expect", [
    ([bytes.fromhex("92 01")], "expected header and body frames"),
    ([b"\xc1", b"\xc0"], "header is not valid msgpack"),
    ("v3", "protocol version 3"),
    ("v2_map", "a version 2 header is a msgpack array, got a map"),
    ("v_true", "protocol version True"),
    ("seq_str", "'seq' must be int"),
    ("frames_mismatch", "header says 2 array frame(s), message has 0"),
    ("reply_kind", "cannot be sent to a mailbox"),
    ([msgpack.packb([2, "ask", "x"]), b"\xc0"], "a version 2 header is an array of 14 fields"),
    ("v2_seq_str", "'seq' must be int"),
    ("v2_as_v1", "its first field (the version) is 1"),
])
def test_undecodable_requests_get_an_error_with_empty_re(dealer, frames, expect):
    bad = {"v3": {"v": 3}, "v2_map": {"v": 2}, "v_true": {"v": True}, "seq_str": {"seq": "1"},
           "frames_mismatch": {"nframes": 2}, "reply_kind": {"kind": "reply", "re": "00"}}
    if frames == "v2_seq_str":
        frames = [msgpack.packb(handmade_v2(seq="1")), msgpack.packb({"x": 1})]
    elif frames == "v2_as_v1":
        frames = [msgpack.packb(handmade_v2(v=1)), msgpack.packb({"x": 1})]
    elif isinstance(frames, str):
        frames = [msgpack.packb(handmade_header(**bad[frames])), msgpack.packb({"x": 1})]
    dealer.send_multipart(frames)
    reply = dealer.recv_multipart()
    h, body = msgpack.unpackb(reply[0]), msgpack.unpackb(reply[1])
    check_header(h, 1)  # an unreadable request is answered in version 1, which every version reads
    assert (h["kind"], h["re"], h["to"], h["method"], h["seq"]) == ("error", "", "?", "", 0)
    assert set(body) == {"type", "message", "peer", "method"}
    assert body["type"] == "ProtocolError" and expect in body["message"] and body["peer"] == "echo/1"


@pytest.mark.parametrize("over,body,frames,typ,expect", [
    ({"method": "nope"}, {}, [], "UnknownMethod", "unknown method 'nope'"),
    ({}, {"y": 1}, [], "BadRequest", "unknown field 'y'"),
    ({"method": "sleep"}, {"seconds": "soon"}, [], "BadRequest", "field 'seconds' must be float"),
    ({"deadline": 1.0}, {"x": 1}, [], "DeadlineExceeded", "deadline passed"),
    ({"nframes": 1}, {"x": msgpack.ExtType(1, msgpack.packb([0, "float32", [4], "numpy"]))}, [b"\0" * 15],
     "ProtocolError", "has 15 bytes, but float32[4] needs 16"),
    ({}, {"x": msgpack.ExtType(7, b"?")}, [], "ProtocolError", "unknown msgpack ext type 7"),
    ({"method": "boom"}, {"text": "kaput"}, [], "ValueError", "kaput"),
])
def test_documented_error_bodies(dealer, over, body, frames, typ, expect):
    h = handmade_header(**over)
    dealer.send_multipart([msgpack.packb(h), msgpack.packb(body)] + frames)
    reply = dealer.recv_multipart()
    rh, rb = msgpack.unpackb(reply[0]), msgpack.unpackb(reply[1])
    check_header(rh, 1)
    assert rh["kind"] == "error" and rh["re"] == h["id"] and rh["parent"] == h["id"]
    assert rb["type"] == typ and expect in rb["message"]
    assert rb["peer"] == "echo/1" and rb["method"] == h["method"]
    assert set(rb) <= {"type", "message", "peer", "method", "traceback"}


def test_tell_gets_no_answer_and_sequence_order_holds(dealer):
    for k in range(5):
        dealer.send_multipart([msgpack.packb(handmade_header(kind="tell", method="record", seq=k + 1)),
                               msgpack.packb({"sender": "handmade/0", "n": k})])
    h = handmade_header(method="seen_list", seq=6)
    dealer.send_multipart([msgpack.packb(h), msgpack.packb(None)])
    reply = dealer.recv_multipart()  # the first thing back is the ask's reply: the tells got none
    rh = msgpack.unpackb(reply[0])
    assert rh["re"] == h["id"]
    seen = [n for s, n in msgpack.unpackb(reply[1]) if s == "handmade/0"]
    assert seen[-5:] == [0, 1, 2, 3, 4]


def test_stats_counts_what_the_document_says(dealer):
    h = handmade_header(method="_stats")
    dealer.send_multipart([msgpack.packb(h), msgpack.packb(None)])
    stats = msgpack.unpackb(dealer.recv_multipart()[1])
    doc = section(doc_text(), "The directory and the built-in methods")
    listed = re.search(r"`_stats` answers a map of counters: (.*?)(?:\n\n|$)", doc, flags=re.S).group(1)
    names = set(re.findall(r"`(\w+)`", listed)) - {"trace_records", "auth_accepted", "auth_refused"}
    assert names <= set(stats), names - set(stats)


CATALOG_HEAD = "| role | method | fields (`?` optional) | reply | what |"


def doc_catalog_rows() -> list[str]:
    """Every row of the document's method tables (those under the catalog's header line), in document order."""
    rows, inside = [], False
    for line in doc_text().splitlines():
        if line == CATALOG_HEAD:
            inside = True
        elif not line.startswith("|"):
            inside = False
        elif inside and not line.startswith("|---"):
            rows.append(line)
    return rows


def test_method_tables_match_the_whole_catalog():
    """Every declared method has its row in the document, as declared, and the document lists no other."""
    from slime_actors.messages import CATALOG, catalog_markdown  # the declared catalog, not used to build anything
    doc_rows = doc_catalog_rows()
    cat_rows = catalog_markdown().splitlines()[2:]
    assert len(cat_rows) == len(CATALOG) and {"controller", "buffer", "rollout", "reward", "trainer"} <= {
        role for role, _ in CATALOG}
    assert len(doc_rows) == len(set(doc_rows)), "a row is listed twice"
    assert sorted(doc_rows) == sorted(cat_rows), (set(cat_rows) - set(doc_rows), set(doc_rows) - set(cat_rows))


def test_python_m_messages_prints_the_whole_catalog():
    """What the document says `python -m slime_actors.messages` does: the table of every declaration."""
    import subprocess
    import sys
    from slime_actors.messages import CATALOG, catalog_markdown
    p = subprocess.run([sys.executable, "-m", "slime_actors.messages"], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == catalog_markdown()
    assert len(p.stdout.strip().splitlines()) == 2 + len(CATALOG)
    assert "| trainer | `train` |" in p.stdout and "| buffer | `get_work` |" in p.stdout
