"""Array checksums declared in the header (`sums`): each array checksummed once per traced hop, not at both ends;
an array passed on unchanged not checksummed again; a changed one always (slime_actors/mailbox/checksums.py)."""

import os

import msgpack
import numpy as np
import pytest
import xxhash
import zmq

from helpers import LoopThread
from slime_actors.actors.base import Actor, handler
from slime_actors.mailbox import RemoteError, codec
from slime_actors.mailbox.checksums import ALGO, FORWARD_MIN
from slime_actors.mailbox.errors import ProtocolError
from slime_actors.runtime import RuntimeConfig
from slime_actors.recorder import writer
from slime_actors.traces.reader import TraceRun

N = FORWARD_MIN // 4 * 4  # float32 elements: 4x the size that is remembered


class Client(Actor):
    role = "client"


class Forwarder(Actor):
    role = "fwd"

    @handler
    def echo(self, x=None):
        return x

    @handler
    def bump(self, t):
        t += 1  # a received tensor is writable: changed in place, sent back from the same frame
        return t

    @handler
    def poke(self, a):
        a[0] = 1.0  # a received numpy array is read-only: this raises

    @handler
    def changed_copy(self, a):
        b = a.copy()
        b[0] += 1
        return b


def _sum(a) -> str:
    return xxhash.xxh3_64_hexdigest(memoryview(np.ascontiguousarray(a)).cast("B"))


@pytest.fixture
def pair(tmp_path):
    """A client and a forwarder on one loop; yields (loop, client, fwd, run_dir, start) where start(trace_client)."""
    lt = LoopThread()
    run_dir = str(tmp_path)
    started = []

    def start(client_traced=True, **rt):
        fwd = Forwarder(0)
        ep = lt.call(fwd.start(RuntimeConfig(run_dir=run_dir, curve=False, **rt)))
        cli = Client(0)
        lt.call(cli.start(RuntimeConfig(run_dir=run_dir, curve=False, trace=client_traced,
                                        static_peers={"fwd/0": ep}, **rt)))
        started.extend([cli, fwd])
        return cli, fwd

    def stop():
        for a in started:
            lt.call(a.stop())
        started.clear()

    yield lt, start, stop, run_dir
    stop()
    lt.close()


def _messages(run_dir, method):
    return [m for m in TraceRun(run_dir).messages().values() if m.method == method and m.header["kind"] == "ask"]


def test_the_wire_checksum_is_the_trace_writers():
    assert ALGO == writer.DIGEST


def test_a_traced_echo_checksums_each_array_once(pair):
    import torch
    lt, start, stop, run_dir = pair
    cli, fwd = start()
    big = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    tensor = torch.arange(N, dtype=torch.float32)
    small = np.arange(10, dtype=np.float32)
    out = lt.call(cli.ask("fwd/0", "echo", {"x": {"big": big, "t": tensor, "small": small}}))
    assert out["big"].tobytes() == big.tobytes() and torch.equal(out["t"], tensor)
    # the client checksummed what it sent; the forwarder reused the declared checksum of the numpy frame it sent
    # back, and checksummed the tensor (writable) and the small array (not worth remembering) again
    assert (cli.mailbox.sums.computed, cli.mailbox.sums.reused) == (3, 0)
    assert (fwd.mailbox.sums.computed, fwd.mailbox.sums.reused) == (2, 1)
    stop()
    (m,) = _messages(run_dir, "echo")
    want = [_sum(big), _sum(tensor.numpy()), _sum(small)]
    for rec in (m.send, m.recv, m.reply_sent, m.reply):
        assert [a[4] for a in rec.arrays] == want, rec
        assert [a[5] for a in rec.arrays] == [None, None, None]  # arrays are not kept by default


def test_a_changed_array_is_checksummed_again(pair):
    import torch
    lt, start, stop, run_dir = pair
    cli, fwd = start()
    t = torch.zeros(N, dtype=torch.float32)
    out = lt.call(cli.ask("fwd/0", "bump", {"t": t}))
    assert float(out[0]) == 1.0
    a = np.zeros(N, dtype=np.float32)
    with pytest.raises(RemoteError, match="read-only"):
        lt.call(cli.ask("fwd/0", "poke", {"a": a}))
    out = lt.call(cli.ask("fwd/0", "changed_copy", {"a": a}))
    assert out[0] == 1.0
    assert fwd.mailbox.sums.reused == 0
    stop()
    (bump,) = _messages(run_dir, "bump")
    assert bump.send.arrays[0][4] == _sum(t.numpy())
    # the reply holds the bumped bytes, in the same frame memory the request arrived in: not the declared checksum
    assert bump.reply_sent.arrays[0][4] == bump.reply.arrays[0][4] == _sum(np.ones(N, dtype=np.float32))
    (cc,) = _messages(run_dir, "changed_copy")
    assert cc.reply.arrays[0][4] == _sum(np.r_[np.float32(1), np.zeros(N - 1, np.float32)])


def test_an_untraced_senders_arrays_are_checksummed_by_a_traced_receiver(pair):
    lt, start, stop, run_dir = pair
    cli, fwd = start(client_traced=False)
    assert cli.mailbox.sums is None
    big = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    lt.call(cli.ask("fwd/0", "echo", {"x": big}))
    # nothing was declared: the receiver checksummed the frame as it arrived, and sent it back with that checksum
    assert (fwd.mailbox.sums.computed, fwd.mailbox.sums.reused) == (1, 1)
    stop()
    (m,) = _messages(run_dir, "echo")
    assert m.send is None and "sums" not in m.header
    assert m.recv.arrays[0][4] == m.reply_sent.arrays[0][4] == _sum(big)


def _bumped(pair, **start):
    """A zero tensor sent to `bump`, which adds 1 to the received (writable) tensor in place: the ask's trace."""
    import torch
    lt, start_actors, stop, run_dir = pair
    cli, fwd = start_actors(**start)
    assert float(lt.call(cli.ask("fwd/0", "bump", {"t": torch.zeros(N, dtype=torch.float32)}))[0]) == 1.0
    stop()
    (m,) = _messages(run_dir, "bump")
    return m


def test_a_received_tensor_changed_by_its_handler_is_recorded_as_it_arrived(pair):
    """With no checksum declared (an untraced sender) the receiver's record must still hold the checksum of what
    arrived -- taken at arrival, not when the trace writer gets to the record (after the handler: before the fix it
    checksummed the changed tensor)."""
    m = _bumped(pair, client_traced=False)
    assert m.recv.arrays[0][4] == _sum(np.zeros(N, np.float32))
    assert m.reply_sent.arrays[0][4] == _sum(np.ones(N, np.float32))


def test_kept_arrays_of_a_received_tensor_changed_by_its_handler_are_as_it_arrived(pair):
    m = _bumped(pair, trace_keep_arrays=True)
    zeros, ones = np.zeros(N, np.float32).tobytes(), np.ones(N, np.float32).tobytes()
    assert m.send.arrays[0][5] == m.recv.arrays[0][5] == zeros
    assert m.reply_sent.arrays[0][5] == m.reply.arrays[0][5] == ones


def test_kept_arrays_keep_their_bytes_with_the_checksum(pair):
    lt, start, stop, run_dir = pair
    cli, fwd = start(trace_keep_arrays=True)
    big = np.random.default_rng(2).standard_normal(N).astype(np.float32)
    lt.call(cli.ask("fwd/0", "echo", {"x": big}))
    stop()
    (m,) = _messages(run_dir, "echo")
    for rec in (m.send, m.recv, m.reply_sent, m.reply):
        assert rec.arrays[0][4] == _sum(big) and rec.arrays[0][5] == big.tobytes()


def _ask_with_sums(sums, nframes=1):
    h = codec.header_v2("ask", "raw/0", "fwd/0", "echo", 1, codec.new_trace_id(), None)
    h[13] = nframes
    return h + [sums]


@pytest.mark.parametrize("sums, message", [
    ("0" * 16, "must be an array of str or nil, got str"),
    (["0" * 16, "0" * 16], "2 checksum(s) for 1 array frame(s)"),
    (["0" * 15], "not an XXH3-64 checksum"),
    (["ABCDEF0123456789"], "not an XXH3-64 checksum"),
    ([17], "not an XXH3-64 checksum"),
])
def test_bad_sums_are_protocol_errors(sums, message):
    with pytest.raises(ProtocolError, match=message.replace("(", r"\(").replace(")", r"\)")):
        codec.decode_header(msgpack.packb(_ask_with_sums(sums)))


def test_a_version_1_map_has_no_sums_whatever_it_holds():
    h = codec.make_header("ask", "raw/0", "fwd/0", "echo", 1, codec.new_trace_id(), None)
    h.update(nframes=1, sums=5)
    assert "sums" not in codec.decode_header(msgpack.packb(h))


def test_declared_sums_are_decoded_and_nil_means_none():
    h = codec.decode_header(msgpack.packb(_ask_with_sums(["0123456789abcdef"])))
    assert h["sums"] == ["0123456789abcdef"] and h["nframes"] == 1
    assert "sums" not in codec.decode_header(msgpack.packb(_ask_with_sums(None)))


def test_a_message_with_bad_sums_gets_an_error_reply_and_the_actor_keeps_serving(pair):
    lt, start, stop, run_dir = pair
    cli, fwd = start()
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger, s.rcvtimeo = 0, 3000
    s.connect(fwd.endpoint)
    try:
        ref = msgpack.ExtType(codec.ARRAY_EXT, msgpack.packb([0, "uint8", [4], "numpy"]))
        s.send_multipart([msgpack.packb(_ask_with_sums(["nothex!!nothex!!"])), msgpack.packb({"x": ref}),
                          b"\x00" * 4])
        head, body = s.recv_multipart()
        assert codec.decode_header(head)["kind"] == "error"
        assert "not an XXH3-64 checksum" in msgpack.unpackb(body)["message"]
    finally:
        s.close()
    assert lt.call(cli.ask("fwd/0", "echo", {"x": 5})) == 5


def test_only_a_read_only_view_of_a_whole_live_frame_reuses_its_checksum():
    import gc
    from slime_actors.mailbox.checksums import ArraySums
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://sums-unit")
    b.connect("inproc://sums-unit")
    try:
        a.send(np.arange(N, dtype=np.float32).tobytes(), copy=False)
        frame = b.recv(copy=False)
    finally:
        a.close()
        b.close()
    sums = ArraySums()
    sums.received([frame], ["0123456789abcdef"])  # declared (deliberately not the real checksum)

    def sent(arr):
        return sums.for_send([arr.reshape(-1).view(np.uint8).data])[0]

    ro = np.frombuffer(frame.buffer.toreadonly(), dtype=np.float32)  # what codec hands a handler
    assert sent(ro) == "0123456789abcdef" and sent(ro.reshape(-1, 4).view(np.int32)) == "0123456789abcdef"
    writable = np.frombuffer(frame.buffer, dtype=np.float32)  # the frame's memory, but writable: checksummed
    assert sent(writable) == _sum(writable)
    part = ro[4:]  # read-only, in the frame, but not all of it
    assert sent(part) == _sum(part)
    assert (sums.reused, sums.computed) == (2, 2)
    del ro, writable, part, frame
    gc.collect()
    assert sums._known == {}  # forgotten with the frame: its memory may hold another message next
