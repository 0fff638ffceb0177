"""Trace completeness: every message sent is recorded as received and handled, with matching ids, trace ids and
parents, across actors in several processes; and `slime-actors trace summary` reports the run.

One traced run (module fixture): a directory and a client on a loop in this process, an echo actor and a relay actor
in child processes. The client sends tells and asks (small bodies, numpy arrays and a torch tensor, a handler that
raises, an unknown method); the relay's handlers send messages of their own (an ask and a tell caused by the message
they handle, an error that travels back up the chain). Then every actor stops cleanly and the run is read back with
TraceRun.
"""

import asyncio
import os
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import Echo, LoopThread, spawn_actor
from slime_actors.actors.base import Actor, handler
from slime_actors.actors.directory import Directory
from slime_actors.log import setup_logging
from slime_actors.mailbox import RemoteError
from slime_actors.runtime import RuntimeConfig
from slime_actors.traces.reader import TraceRun


class Relay(Actor):
    """Sends messages from inside its handlers: they must carry the handled message's trace id and id as parent."""

    role = "relay"

    @handler
    async def forward(self, x, n: int):
        echoed = await self.ask("echo/1", "echo", {"x": x}, timeout=20)
        await self.tell("echo/1", "record", {"sender": self.name, "n": n})
        return echoed

    @handler
    async def fail_deeper(self) -> None:
        await self.ask("echo/1", "boom", {"text": "deep"}, timeout=20)  # raises RemoteError: so does this handler

    @handler
    async def poke(self, n: int) -> None:  # reached by a tell; its ask is caused by that tell
        await self.ask("echo/1", "echo", {"x": n}, timeout=20)


class Client(Actor):
    role = "client"


SCRIPT_ECHO_ASKS = 4   # asks of echo/1.echo sent by the client: hello, arrays, 2 idempotent (the relay adds 2)
SCRIPT_TELLS = 6


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("traced") / "run")
    os.makedirs(run_dir)
    # the in-process actors log through structlog; an earlier test may have left it printing to a closed stream
    setup_logging(run_dir, "test-traces", console=False)
    lt = LoopThread()
    procs = []
    try:
        base = dict(run_dir=run_dir, curve=False, heartbeat_interval=0.5, liveness=60)  # loaded CI: no false downs
        directory = Directory(0)
        dep = lt.call(directory.start(RuntimeConfig(**base)))
        rt = RuntimeConfig(directory=dep, **base)
        procs.append(spawn_actor(Echo, 1, rt))
        procs.append(spawn_actor(Relay, 0, rt))
        client = Client(0)
        lt.call(client.start(rt))

        async def script():
            import torch
            out = {}
            out["hello"] = await client.ask("echo/1", "echo", {"x": "hello"}, timeout=20)
            arrays = {"a": np.arange(1000, dtype=np.float32), "t": torch.arange(6, dtype=torch.int64).reshape(2, 3)}
            out["arrays"] = await client.ask("echo/1", "echo", {"x": arrays}, timeout=20)
            for k in range(5):
                await client.tell("echo/1", "record", {"sender": client.name, "n": k})
            out["forward"] = await client.ask("relay/0", "forward", {"x": np.ones(10, dtype=np.float64), "n": 99},
                                              timeout=20)
            for method, body in (("boom", {"text": "kaput"}), ("nope", {})):
                try:
                    await client.ask("echo/1", method, body, timeout=20)
                except RemoteError as exc:
                    out[method] = exc
            try:
                await client.ask("relay/0", "fail_deeper", timeout=20)
            except RemoteError as exc:
                out["fail_deeper"] = exc
            await client.tell("relay/0", "poke", {"n": 7})
            out["idem"] = [await client.ask("echo/1", "echo", {"x": 5}, idem="k", timeout=20) for _ in range(2)]
            # everything before is handled once this is answered (per-sender FIFO), except what the relay sends
            # for poke: wait until echo has seen the relay's record and answered poke's ask
            for _ in range(200):
                seen = await client.ask("echo/1", "seen_list", timeout=20)
                if ["relay/0", 99] in seen and (await client.ask("relay/0", "_stats"))["handled"] >= 3:
                    break
                await asyncio.sleep(0.05)
            out["seen"] = seen
            return out

        out = lt.call(script(), timeout=120)
        for p, name in zip(reversed(procs), ("relay/0", "echo/1")):
            lt.call(client.ask(name, "_stop", {"reason": "test over"}, timeout=20))
            p.join(30)
            assert p.exitcode == 0, f"{name} did not stop cleanly"
        lt.call(client.stop())
        time.sleep(0.3)  # the last heartbeats and the deregister notices reach the directory
        lt.call(directory.stop())
        return run_dir, out
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        lt.close()


def test_script_ran_as_expected(traced_run):
    _, out = traced_run
    assert out["hello"] == "hello"
    assert out["arrays"]["a"].tolist() == list(range(1000)) and out["arrays"]["t"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert out["forward"].tolist() == [1.0] * 10
    assert out["boom"].type == "ValueError" and out["nope"].type == "UnknownMethod"
    assert out["fail_deeper"].type == "RemoteError" and "deep" in out["fail_deeper"].message
    assert out["idem"] == [5, 5]
    assert ["relay/0", 99] in out["seen"]


def test_every_sent_message_is_received_and_handled(traced_run):
    run_dir, _ = traced_run
    run = TraceRun(run_dir)
    assert run.problems == []
    assert set(run.actors()) == {"directory/0", "client/0", "echo/1", "relay/0"}
    assert len(run.files) == 4 and len({f.meta["pid"] for f in run.files}) == 3

    sends = [e for f in run.files for e in f.events if e.ev == "send"]
    assert not [e for f in run.files for e in f.events if e.ev == "drop"]
    requests = [e for e in sends if e.kind in ("tell", "ask", "hb")]
    kinds = {k: sum(1 for e in requests if e.kind == k) for k in ("tell", "ask", "hb")}
    assert kinds["ask"] >= 20 and kinds["tell"] >= SCRIPT_TELLS + 1 and kinds["hb"] >= 3, kinds

    msgs = run.messages()
    for s in requests:
        m = msgs[s.id]
        assert m.send is s and s.actor == s.header["from"]
        assert m.recv is not None, f"{s.kind} {s.header['from']}->{s.header['to']} {s.method} never received"
        assert m.recv.actor == s.header["to"]
        assert m.recv.header == s.header  # the very same envelope: id, trace, parent, seq, deadline...
        assert m.recv.t_ns >= s.t_ns - 50_000_000  # same host: clocks agree to well within 50 ms
        if s.kind == "hb":
            continue
        assert m.handled is not None, f"{s.kind} {s.method} received by {m.recv.actor} but never handled"
        assert m.handled.actor == m.recv.actor and m.handled.header == s.header
        assert m.handled.t_ns >= m.recv.t_ns
        outcome = m.handled.extra["outcome"]
        assert outcome in ("ok", "error", "rejected", "cached")
        if outcome == "cached":  # an idempotent duplicate, answered from the first one's outcome
            outcome = "ok" if m.handled.extra["cached"] == "reply" else "error"
        if s.kind == "ask":
            assert m.reply_sent is not None and m.reply_sent.actor == m.recv.actor
            assert m.reply is not None and m.reply.actor == s.actor, f"ask {s.method}: reply never came back"
            rh = m.reply.header
            assert rh == m.reply_sent.header
            assert rh["re"] == rh["parent"] == s.id and rh["trace"] == s.header["trace"]
            assert rh["kind"] == ("reply" if outcome == "ok" else "error")
            assert rh["to"] == s.actor and rh["from"] == m.recv.actor
    # nothing was received that was not sent (every recv of a request has its send)
    recvs = [e for f in run.files for e in f.events if e.ev == "recv" and e.kind in ("tell", "ask", "hb")]
    assert sorted(e.id for e in recvs) == sorted(e.id for e in requests)
    # per-sender sequence numbers: consecutive on each connection
    by_conn = {}
    for e in sorted(requests, key=lambda e: e.t_ns):
        by_conn.setdefault((e.header["from"], e.header["to"]), []).append(e.header["seq"])
    for conn, seqs in by_conn.items():
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), conn


def _find(msgs, sender, method, **body):
    out = [m for m in msgs.values() if m.header["from"] == sender and m.method == method
           and m.header["kind"] in ("tell", "ask")
           and all(m.send.body().get(k) == v for k, v in body.items())]
    assert out, (sender, method, body)
    return out


def test_causal_chains_carry_trace_and_parent(traced_run):
    run_dir, _ = traced_run
    msgs = TraceRun(run_dir).messages()

    # every message with a parent: the parent was received by its sender before it was sent, in the same trace
    caused = [m for m in msgs.values() if m.header.get("parent") and m.header["kind"] in ("tell", "ask")]
    assert len(caused) >= 4
    for m in caused:
        p = msgs[m.header["parent"]]
        assert p.recv is not None and p.recv.actor == m.header["from"], (m.method, p.method)
        assert m.header["trace"] == p.header["trace"]
        assert p.recv.t_ns <= m.send.t_ns

    (fwd,) = _find(msgs, "client/0", "forward")
    children = [m for m in msgs.values() if m.header.get("parent") == fwd.id]
    # the relay's first message to echo/1 made it look echo/1 up: that ask is caused by forward too
    assert sorted((m.header["kind"], m.header["to"], m.method) for m in children) == [
        ("ask", "directory/0", "lookup"), ("ask", "echo/1", "echo"), ("tell", "echo/1", "record")]
    for c in children:
        assert c.header["trace"] == fwd.header["trace"] and c.handled.extra["outcome"] == "ok"
        # sent from inside the handler: between the forward's arrival and the end of its handling
        assert fwd.recv.t_ns <= c.send.t_ns <= fwd.handled.t_ns
    assert fwd.reply.header["kind"] == "reply"

    # an error travels back up the chain: boom fails in echo, so fail_deeper fails in relay
    (deeper,) = _find(msgs, "client/0", "fail_deeper")
    (boom,) = [m for m in msgs.values() if m.header.get("parent") == deeper.id]
    assert boom.method == "boom" and boom.header["trace"] == deeper.header["trace"]
    assert boom.handled.extra["outcome"] == "error" and "ValueError: deep" in boom.handled.extra["error"]
    assert boom.reply.header["kind"] == "error" and boom.reply.body()["type"] == "ValueError"
    assert deeper.handled.extra["outcome"] == "error" and deeper.reply.header["kind"] == "error"
    assert deeper.reply.body()["type"] == "RemoteError"

    # a tell can cause messages too
    (poke,) = _find(msgs, "client/0", "poke")
    (poked,) = [m for m in msgs.values() if m.header.get("parent") == poke.id]
    assert poked.method == "echo" and poked.header["trace"] == poke.header["trace"]
    assert poked.reply.body() == 7

    # root messages (sent outside any handler) start their own traces
    roots = _find(msgs, "client/0", "echo")
    assert len({m.header["trace"] for m in roots}) == len(roots)
    assert all("parent" not in m.header for m in roots)


def test_arrays_errors_and_rejections_are_recorded(traced_run):
    run_dir, _ = traced_run
    msgs = TraceRun(run_dir).messages()
    (arr,) = [m for m in _find(msgs, "client/0", "echo") if m.send.arrays]
    sent = arr.send.arrays
    assert [(a[0], a[1], a[2], a[3]) for a in sent] == [("float32", [1000], "numpy", 4000),
                                                       ("int64", [2, 3], "torch", 48)]
    assert arr.header["nframes"] == 2
    got = arr.recv.arrays
    assert [a[3] for a in got] == [4000, 48] and [a[4] for a in got] == [a[4] for a in sent]  # same checksums
    assert all(re.fullmatch(r"[0-9a-f]{16}", a[4]) for a in sent)  # XXH3-64 (the header says so)
    body = arr.send.body()
    assert body["x"]["a"]["__array__"] == "float32" and body["x"]["a"]["hash"] == sent[0][4]
    assert [a[4] for a in arr.reply.arrays] == [a[4] for a in sent]  # echoed back: the same bytes

    (boom,) = _find(msgs, "client/0", "boom")
    assert boom.handled.extra["outcome"] == "error" and "ValueError: kaput" in boom.handled.extra["error"]
    (nope,) = _find(msgs, "client/0", "nope")
    assert nope.handled.extra["outcome"] == "rejected" and "UnknownMethod" in nope.handled.extra["error"]
    assert nope.reply.body()["type"] == "UnknownMethod"

    idem = [m for m in _find(msgs, "client/0", "echo", x=5) if m.header.get("idem") == "k"]
    assert len(idem) == 2 and [m.reply.body() for m in idem] == [5, 5]
    assert sorted(m.handled.extra["outcome"] for m in idem) == ["cached", "ok"]


def slime_actors_cli() -> str:
    path = os.path.join(os.path.dirname(sys.executable), "slime-actors")
    assert os.path.exists(path), f"no slime-actors script next to {sys.executable}"
    return path


def test_trace_summary_cli(traced_run):
    run_dir, _ = traced_run
    res = subprocess.run([slime_actors_cli(), "trace", "summary", run_dir], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "4 trace file(s)" in lines[0] and "relay/0" in lines[0]
    head = next(i for i, line in enumerate(lines) if line.startswith("role"))
    cols = lines[head].split()
    assert cols[:6] == ["role", "method", "tell", "ask", "bytes", "err"] and "p50" in lines[head]
    rows = {}
    for line in lines[head + 2:]:
        if not line.strip():
            break
        cells = line.split()
        rows[(cells[0], cells[1])] = cells
    # counts per receiving role and method
    echo = rows[("echo", "echo")]
    assert int(echo[2]) == 0 and int(echo[3]) == SCRIPT_ECHO_ASKS + 2  # + the relay's for forward and poke
    record = rows[("echo", "record")]
    assert int(record[2]) == SCRIPT_TELLS - 1 + 1 and int(record[3]) == 0  # 5 from the client, 1 from the relay
    boom = rows[("echo", "boom")]
    assert int(boom[3]) == 2 and int(boom[5]) == 2  # the client's and the relay's: both failed
    assert int(rows[("echo", "nope")][5]) == 1
    assert int(rows[("relay", "forward")][3]) == 1 and int(rows[("relay", "poke")][2]) == 1
    assert int(rows[("directory", "register")][3]) == 3
    # latency percentiles: numbers in ms, p50 <= p95 <= p99
    rtt = [float(x) for x in echo[6:9]]
    handle = [float(x) for x in echo[9:12]]
    assert 0 < rtt[0] <= rtt[1] <= rtt[2] < 20_000
    # a handler's time counts from the request's arrival, an ask's round trip from when its send had left the
    # asker (docs/trace-format.md): in a busy process that stamp can come a GIL switch interval (5 ms) late, so a
    # handler's time may exceed its round trip by that much (seen: 1099.4 against 1096.8 ms, the first tensor's
    # torch import in the echo)
    assert 0 <= handle[0] <= handle[1] <= handle[2] <= rtt[2] + 10
    assert rows[("relay", "poke")][6] == "-"  # a tell has no round trip
    assert "slowest messages" in res.stdout


def test_trace_summary_cli_on_a_missing_run(tmp_path):
    res = subprocess.run([slime_actors_cli(), "trace", "summary", str(tmp_path / "nothing")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "no such run directory" in res.stderr


def test_checksum_algorithm_is_named_and_old_crc32_traces_still_compare(tmp_path):
    import zlib

    from slime_actors.traces.compare import first_difference
    from slime_actors.traces.reader import read_file
    from slime_actors.recorder.writer import TraceWriter, digest
    w = TraceWriter(tmp_path / "a.trace", "x/0")
    w.close()
    assert read_file(tmp_path / "a.trace").meta["digest"] == "xxh3_64"
    data = b"some array bytes" * 1000
    assert len(digest(data)) == 16 and digest(data) == digest(bytearray(data)) != digest(data + b"!")
    assert digest(data, "crc32") == f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"
    with pytest.raises(ValueError, match="unknown trace digest 'md5'"):
        digest(data, "md5")
    old = {"x": {"__array__": "float32", "shape": [4], "hash": digest(data, "crc32")}}
    new = {"x": {"__array__": "float32", "shape": [4], "hash": digest(data)}}
    assert first_difference(old, new) is None                      # two algorithms: dtype and shape only
    assert first_difference(new, {"x": {**new["x"], "hash": digest(data + b"!")}}) is not None
    assert first_difference(old, {"x": {**new["x"], "shape": [5]}}) is not None


def test_two_packed_batch_columns_are_compared_row_by_row():
    """The trainer's batch comes packed (types.pack_rows): `trace diff` and `replay` name the sample and the token
    that differ, as they did when it came as lists -- not two byte strings."""
    from slime_actors.traces.compare import first_difference
    from slime_actors.types import pack_rows
    a = {"tokens": pack_rows([[1, 2, 3], [4, 5]], "int"), "lp": pack_rows([[-0.5], [-1.25, -2.0]], "float32")}
    assert first_difference(a, {**a}) is None
    d = first_difference(a, {**a, "tokens": pack_rows([[1, 2, 3], [4, 9]], "int")})
    assert (d.path, d.a, d.b) == ("tokens[1][1]", 5, 9)
    assert first_difference(a, {**a, "lp": pack_rows([[-0.5], [-1.25, -2.0000001]], "float32")}) is None  # tolerance
    d = first_difference(a, {**a, "tokens": pack_rows([[1, 2, 3], [4, 5, 6]], "int")})
    assert (d.path, d.a, d.b) == ("tokens[1].length", 2, 3)


def test_a_returned_handler_is_one_record_with_its_outcome(traced_run):
    """The common case is written as one recv record with dur_ns appended (format version 4, and since), read back as
    a recv and an ok handled event dur_ns after it."""
    import glob

    import msgpack

    from slime_actors.traces.reader import read_file
    run_dir, _ = traced_run
    (path,) = glob.glob(os.path.join(run_dir, "traces", "echo-1.*.trace"))
    up = msgpack.Unpacker(open(path, "rb"), raw=False)
    meta = next(up)
    long_records = [r for r in up if len(r) == 9]
    assert meta["version"] == 6 and long_records
    assert all(r[0] == "recv" and r[8] >= 0 for r in long_records)
    handled = {e.id: e for e in read_file(path).events if e.ev == "handled"}
    for r in long_records:
        mid = msgpack.unpackb(r[2])[2]  # a version-2 header: the id is its third field
        assert handled[mid].t_ns == r[1] + r[8] and handled[mid].extra == {"outcome": "ok", "dur_ns": r[8]}


def test_a_closed_trace_ends_with_an_end_record_and_a_killed_one_does_not(tmp_path):
    """Version 6: the writer's close() writes an end record; a file without one was cut short (its process killed),
    which replay needs to know (it stops at the cut). The header names the environment that decides the floats."""
    import signal

    from slime_actors.traces.reader import read_file
    from slime_actors.recorder.writer import TraceWriter
    w = TraceWriter(tmp_path / "x-0.1.trace", "x/0")
    w.record_input("clock", 1.5)
    w.close()
    tf = read_file(tmp_path / "x-0.1.trace")
    assert tf.complete is True and tf.end["records"] == 1 and tf.end["lost"] == 0
    assert [e.name for e in tf.events] == ["clock"]
    env = tf.meta["environment"]
    assert env["python"] and env["cpu"]["usable_cores"] >= 1 and "packages" in env
    code = ("import os, signal, sys, time; from slime_actors.recorder.writer import TraceWriter; "
            "w = TraceWriter(sys.argv[1], 'x/0'); w.record_input('clock', 2.5); w.flush(); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "y-0.2.trace")], timeout=120)
    assert res.returncode == -signal.SIGKILL
    tf = read_file(tmp_path / "y-0.2.trace")
    assert tf.complete is False and [e.name for e in tf.events] == ["clock"]


def test_a_bounded_trace_rotates_keeping_its_first_and_newest_segments(tmp_path):
    """--trace-max-bytes: segments of max/8 bytes; the first (the actor's start, which replay runs) and the newest
    are kept, 8 in all; each ends with an end record naming the next; readers say what was deleted."""
    from slime_actors.traces.reader import read_file
    from slime_actors.recorder.writer import SEGMENTS, TraceWriter
    bound = SEGMENTS * 65536
    w = TraceWriter(tmp_path / "x-0.1.trace", "x/0", max_bytes=bound)
    n = 0
    for _ in range(400):
        for _ in range(100):
            w.record_input("clock", n, key=f"{n:08d}")
            n += 1
        w.flush()  # (the writer thread's drain: a rotation happens after one)
    w.close()
    files = sorted(tmp_path.glob("x-0.1*.trace"), key=lambda p: read_file(p).segment)
    segs = [read_file(p) for p in files]
    assert len(files) == SEGMENTS and w.deleted > 0 and segs[0].segment == 0
    assert [s.segment for s in segs[1:]] == list(range(segs[1].segment, segs[1].segment + SEGMENTS - 1))
    assert sum(p.stat().st_size for p in files) <= bound + SEGMENTS * 8192  # (a drain's worth over, at most)
    assert all(s.rotated for s in segs[:-1]) and segs[-1].complete
    assert segs[0].end["rotated"] == "x-0.1.1.trace"
    values = [e.body() for s in segs for e in s.events]
    assert values[0] == 0 and values[-1] == n - 1  # the start and the end of the actor's life
    assert values == sorted(values)
    run = TraceRun(tmp_path)
    assert any(f"trace segment(s) 1-{segs[1].segment - 1} were deleted by rotation" in p for p in run.problems), \
        run.problems


def test_the_batch_a_rank_trained_on_is_the_one_its_train_named():
    """`trained_batches`: per step, the shard the rank asked for ahead (wait_batch) when its id is the one the
    controller's train named; the one it pulled (get_batch) when it set that aside -- or asked for none ahead."""
    from slime_actors.traces.query import trained_batches
    from slime_actors.traces.reader import Message

    class Ev:
        def __init__(self, body):
            self.t_ns, self._body = 0, body

        def body(self):
            return self._body

    def msg(mid, frm, to, method, body, reply):
        header = {"id": mid, "from": frm, "to": to, "method": method, "kind": "ask"}
        return Message(mid, header, send=Ev(body), reply=Ev(reply))
    msgs = [msg("t0", "controller/0", "trainer/0", "train", {"rollout_id": 0, "batch_id": "a"}, {}),
            msg("g0", "trainer/0", "buffer/0", "get_batch", {"rollout_id": 0}, {"tokens": ["pulled 0"]}),
            msg("t1", "controller/0", "trainer/0", "train", {"rollout_id": 1, "batch_id": "b"}, {}),
            msg("w1", "trainer/0", "buffer/0", "wait_batch", {"rollout_id": 1},
                {"batch_id": "b", "batch": {"tokens": ["ahead 1"]}}),
            msg("t2", "controller/0", "trainer/0", "train", {"rollout_id": 2, "batch_id": "c2"}, {}),
            msg("w2", "trainer/0", "buffer/0", "wait_batch", {"rollout_id": 2},      # (made again since: set aside)
                {"batch_id": "c1", "batch": {"tokens": ["stale 2"]}}),
            msg("g2", "trainer/0", "buffer/0", "get_batch", {"rollout_id": 2}, {"tokens": ["pulled 2"]}),
            msg("w3", "trainer/0", "buffer/0", "wait_batch", {"rollout_id": 3}, None)]   # (the job ended)
    run = SimpleNamespace(messages=lambda: {m.id: m for m in msgs})
    assert trained_batches(run) == {0: {"tokens": ["pulled 0"]}, 1: {"tokens": ["ahead 1"]},
                                    2: {"tokens": ["pulled 2"]}}
