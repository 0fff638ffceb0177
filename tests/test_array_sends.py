"""Arrays are sent from the sender's memory (zero-copy): what the peer receives must still be the array as it was
when it was sent, whatever the sender writes to it afterwards (docs/wire-format.md, "Arrays are sent from your
memory").

  * a tell copies a writable array under TELL_COPY_MAX, and for a larger one returns once ZeroMQ has let go of it,
    so writing to them afterwards is safe; a read-only array is sent as is, without waiting;
  * an ask is safe once its reply has come (the peer had the whole message before it answered);
  * a reply carries a copy of a writable array (the handler's actor may change it right after returning); a
    read-only one -- an array received and passed on, or one the handler marked read-only -- is sent zero-copy.
"""

import asyncio
import os

import numpy as np
import pytest

from slime_actors.actors.base import Actor, handler
from slime_actors.mailbox.mailbox import TELL_COPY_MAX, ZERO_COPY_MIN
from slime_actors.runtime import RuntimeConfig

N = 8 << 20  # float32: 32 MiB, far more than a socket buffer holds -- the send takes a while
assert N * 4 >= TELL_COPY_MAX  # tells of N floats are sent from their memory, not copied


class Store(Actor):
    """Keeps what it is told; answers with its live storage, and changes that storage when told to."""

    role = "store"

    def __init__(self, index=0, **config):
        super().__init__(index, **config)
        self.got = []
        self.live = np.zeros(N, np.float32)
        self.frozen = np.full(N, 7.0, np.float32)
        self.frozen.setflags(write=False)

    @handler
    def put(self, x=None):
        self.got.append((float(x.min()), float(x.max())))

    @handler
    def got_so_far(self):
        return self.got

    @handler
    def live_view(self):
        return {"x": self.live}  # the actor's own storage, writable: the reply must carry a copy

    @handler
    def frozen_view(self):
        return {"x": self.frozen}  # read-only: sent zero-copy

    @handler
    def overwrite(self, value: float = 0.0):
        self.live[:] = value

    @handler
    def echo(self, x=None):
        return x


class Sender(Actor):
    role = "sender"


def _rt(run_dir, **kw):
    return RuntimeConfig(run_dir=run_dir, curve=False, trace=False, **kw)


@pytest.fixture
def actors(loop_thread, run_dir):
    """A factory: actors(late=False, **sender_rt) -> (sender, store, start_store). With late, the store is not up
    yet -- the sender's messages wait in ZeroMQ's queue until `await start_store()` binds it where they go. Called
    inside the test, so that a test can patch the mailbox first. Both are stopped afterwards."""
    started = []

    def make(late=False, **sender_rt):
        store = Store(0)
        endpoint = f"ipc://{os.path.join(run_dir, 'late-store.sock')}"
        if late:
            async def start_store():
                await store.start(_rt(run_dir), endpoint=endpoint)
                started.append(store)
        else:
            endpoint = loop_thread.call(store.start(_rt(run_dir)))
            started.append(store)
            start_store = None
        sender = Sender(0)
        rt = {"curve": False, "trace": False, **sender_rt}
        loop_thread.call(sender.start(RuntimeConfig(run_dir=run_dir, static_peers={"store/0": endpoint}, **rt)))
        started.append(sender)
        return sender, store, start_store

    yield make
    for a in reversed(started):
        loop_thread.call(a.stop())


def test_a_tell_returns_only_once_its_arrays_are_sent(loop_thread, actors):
    """The receiver is not up yet: the tell's message waits in ZeroMQ's queue, read from the caller's array. The
    tell must not return until it has gone (before the fix it returned at once, and the overwrite below reached
    the receiver)."""
    sender, store, start_store = actors(late=True)
    arr = np.ones(N, np.float32)

    async def scenario():
        tell = asyncio.ensure_future(sender.tell("store/0", "put", {"x": arr}))
        await asyncio.sleep(0.3)
        waited = not tell.done()
        await start_store()
        await asyncio.wait_for(tell, 30)
        arr[:] = -1.0  # the caller reuses its buffer right after the tell returned
        return waited, await sender.ask("store/0", "got_so_far")

    waited, got = loop_thread.call(scenario(), timeout=60)
    assert waited, "the tell returned while its array was still queued, read from the caller's memory"
    assert got == [[1.0, 1.0]], got


def test_tells_of_an_array_rewritten_after_each_send_arrive_intact(loop_thread, actors):
    sender, store, _ = actors()
    arr = np.empty(N, np.float32)

    async def scenario():
        for i in range(6):
            arr[:] = i
            await sender.tell("store/0", "put", {"x": arr})
            arr[:] = -1.0
        return await sender.ask("store/0", "got_so_far")

    assert loop_thread.call(scenario(), timeout=60) == [[float(i), float(i)] for i in range(6)]


async def _live_views_around_overwrites(sender, values):
    """Ask for the store's live storage, with an overwrite told right behind each ask (per-sender FIFO: it runs
    while the reply may still be going out); (min, max) of each answer."""
    out = []
    for value in values:
        asking = asyncio.ensure_future(sender.ask("store/0", "live_view", timeout=30))
        await asyncio.sleep(0)  # the ask is sent first, then the overwrite
        await sender.tell("store/0", "overwrite", {"value": value})
        x = (await asking)["x"]
        out.append((float(x.min()), float(x.max())))
    return out


def test_a_reply_of_live_storage_is_not_changed_by_what_the_actor_does_next(loop_thread, actors):
    """The actor answers with its own writable array and overwrites it in the very next message, while the reply's
    32 MiB are still being written out: the asker gets the array as it was when the handler returned."""
    sender, store, _ = actors()
    # live starts at 0, and each ask is answered before the overwrite behind it runs
    got = loop_thread.call(_live_views_around_overwrites(sender, (1.0, 2.0, 3.0)), timeout=60)
    assert got == [(0.0, 0.0), (1.0, 1.0), (2.0, 2.0)]


def test_read_only_arrays_are_answered_zero_copy_and_writable_ones_copied(loop_thread, actors, monkeypatch):
    """What the reply path passes to ZeroMQ: a read-only array (marked so, or received and passed on) goes as is;
    a writable one is copied; small frames are copied either way."""
    from slime_actors.mailbox import mailbox as mb

    sends = []
    real = mb._backend_send

    def spy(sock, data, flags=0, copy=True, track=False):
        if len(memoryview(data)) >= ZERO_COPY_MIN:
            sends.append(copy)
        return real(sock, data, flags, copy=copy, track=track)

    monkeypatch.setattr(mb, "_backend_send", spy)
    sender, store, _ = actors()
    x = loop_thread.call(sender.ask("store/0", "frozen_view"))["x"]
    assert float(x.max()) == 7.0 and sends == [False], sends  # the reply: zero-copy
    sends.clear()
    loop_thread.call(sender.ask("store/0", "live_view"))
    assert sends == [True], sends  # the reply: copied
    sends.clear()
    big = np.arange(N, dtype=np.float32)
    assert np.array_equal(loop_thread.call(sender.ask("store/0", "echo", {"x": big})), big)
    # the ask zero-copy (its reply proves the peer had it), the echo's reply of the received, read-only array
    # zero-copy too
    assert sends == [False, False], sends


@pytest.mark.parametrize("nbytes", [ZERO_COPY_MIN - 4, ZERO_COPY_MIN])
def test_tells_around_the_zero_copy_size_arrive_intact(loop_thread, actors, nbytes):
    sender, store, _ = actors()
    arr = np.full(nbytes // 4, 5.0, np.float32)

    async def scenario():
        await sender.tell("store/0", "put", {"x": arr})
        arr[:] = 0.0
        return await sender.ask("store/0", "got_so_far")

    assert loop_thread.call(scenario(), timeout=60) == [[5.0, 5.0]]


def test_a_reply_that_must_wait_for_room_carries_the_array_as_the_handler_returned_it(loop_thread, actors,
                                                                                      monkeypatch):
    """The asker's queue is full when the actor answers (simulated: the reply's first send attempt finds no room),
    so the reply goes out later -- after the actor has overwritten its storage in the next message. It must carry
    the array as it was when the handler returned, not as it is when there is room again."""
    from slime_actors.mailbox.mailbox import Mailbox

    real = Mailbox._try_send
    refused = []

    def full_once(sock, head, hb, bb, buffers, copy_below=0):
        if head is not None and buffers and not refused:
            refused.append(len(buffers))
            return False
        return real(sock, head, hb, bb, buffers, copy_below)

    monkeypatch.setattr(Mailbox, "_try_send", staticmethod(full_once))
    sender, store, _ = actors()
    got = loop_thread.call(_live_views_around_overwrites(sender, (9.0,)), timeout=60)
    assert refused == [1], "the reply was never refused: the test did not exercise a reply sent later"
    assert got == [(0.0, 0.0)], got


def test_a_tell_to_a_peer_that_never_takes_it_returns_when_the_peer_is_dropped(loop_thread, actors):
    """Nobody binds the endpoint: the tell waits while its array is queued (it is read from the caller's memory
    until then), and returns once the connection is dropped (a peer declared down) and the message with it."""
    sender, store, _ = actors(late=True)
    arr = np.ones(N, np.float32)

    async def scenario():
        tell = asyncio.ensure_future(sender.tell("store/0", "put", {"x": arr}))
        await asyncio.sleep(0.3)
        waiting = not tell.done()
        sender.mailbox.disconnect("store/0")
        await asyncio.wait_for(tell, 10)
        return waiting

    assert loop_thread.call(scenario(), timeout=30)


def test_a_trace_that_keeps_arrays_keeps_them_as_they_were_sent(loop_thread, run_dir, actors):
    """With --trace-keep-arrays the send record holds the array's bytes: those as sent, not as the caller's buffer
    holds them when the trace writer gets to the record (it runs later, on its own thread)."""
    from slime_actors.traces.reader import TraceRun

    sender, store, _ = actors(trace=True, trace_keep_arrays=True)
    arr = np.full(ZERO_COPY_MIN // 4, 3.0, np.float32)

    async def scenario():
        await sender.tell("store/0", "put", {"x": arr})
        arr[:] = -1.0
        await sender.ask("store/0", "got_so_far")

    loop_thread.call(scenario(), timeout=60)
    loop_thread.call(sender.stop())  # (stopped twice: the fixture's stop of a stopped actor does nothing)
    (put,) = [m for m in TraceRun(run_dir).messages().values() if m.method == "put"]
    assert put.send.arrays[0][5] == np.full(ZERO_COPY_MIN // 4, 3.0, np.float32).tobytes()


@pytest.mark.parametrize("nbytes", [ZERO_COPY_MIN, TELL_COPY_MAX - 4])
def test_a_tell_of_a_smaller_writable_array_returns_at_once_and_sends_a_copy(loop_thread, actors, nbytes):
    """Under TELL_COPY_MAX a tell copies: it returns while the peer is not even up, and what arrives later is the
    array as it was (sent from its memory without the copy, the overwrite below would be what arrived)."""
    sender, store, start_store = actors(late=True)
    arr = np.full(nbytes // 4, 2.0, np.float32)

    async def scenario():
        await asyncio.wait_for(sender.tell("store/0", "put", {"x": arr}), 5)
        arr[:] = -1.0
        await start_store()
        return await sender.ask("store/0", "got_so_far")

    assert loop_thread.call(scenario(), timeout=60) == [[2.0, 2.0]]


def test_a_tell_of_a_read_only_array_does_not_wait(loop_thread, actors):
    """Read-only (nothing changes it): sent from its memory, and the tell returns while the peer is not up."""
    sender, store, start_store = actors(late=True)
    arr = np.full(N, 4.0, np.float32)
    arr.setflags(write=False)

    async def scenario():
        await asyncio.wait_for(sender.tell("store/0", "put", {"x": arr}), 5)
        await start_store()
        return await sender.ask("store/0", "got_so_far")

    assert loop_thread.call(scenario(), timeout=60) == [[4.0, 4.0]]
