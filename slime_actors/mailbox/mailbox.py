"""The mailbox: one ZeroMQ ROUTER per actor for what it receives, one DEALER per peer for what it sends.

    peer DEALER  --(tell/ask)-->  our ROUTER      (requests come in on the ROUTER, tagged with the connection id)
    our ROUTER   --(reply/error)-> peer DEALER    (answers go back over the connection the ask came in on)
    our DEALER   --(tell/ask)-->  peer ROUTER     (what we send; answers come back on this DEALER)

Every socket is driven from the event loop (uvloop where installed) by `add_reader` on its ZMQ_FD, with
non-blocking sends and receives: no threads, no per-message tasks on the send path. Backpressure is real: each
DEALER has a send high-water mark, a peer has a bound on asks in flight, and when the actor's handlers are all busy
the ROUTER stops reading, so a fast sender waits instead of growing a queue.

A per-sender FIFO holds because each sender reaches each receiver over exactly one connection.

Large array frames are sent from the sender's memory, and what a peer receives is still the array as it was sent: a
tell copies writable ones under TELL_COPY_MAX and returns once ZeroMQ has let go of larger ones, an ask's reply
means the peer had them, and a reply copies writable ones (docs/wire-format.md, "Arrays are sent from your memory").
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgpack
import zmq
import zmq.backend

from . import allocator, codec
from .checksums import ArraySums
from .codec import ArrayRef, ProtocolError
from .errors import AskTimeout, MailboxError, MessageTooLarge, PeerDown, RemoteError, UnknownPeer
from .security import Authenticator, JobKeys
from .tracing import LATE, Tracer, fast_entries

# (trace id, message id) of the message whose handler is running: what a message sent from there is caused by.
current_cause: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("slime_actors_cause",
                                                                                       default=None)

_ctx: zmq.Context | None = None

# plain ints: pyzmq's enum flags cost microseconds per operation on the hot path
POLLIN, POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)
NOBLOCK, SNDMORE, EVENTS = int(zmq.NOBLOCK), int(zmq.SNDMORE), int(zmq.EVENTS)
SEND_MORE_NOW = NOBLOCK | SNDMORE
RCVMORE = int(zmq.RCVMORE)
_backend_send = zmq.backend.Socket.send  # skips pyzmq's Python-level wrapper (routing_id/group handling)
# Array frames this large are sent from the sender's memory; smaller ones are copied (cheaper than the bookkeeping)
ZERO_COPY_MIN = 65536
# A tell copies a writable array smaller than this and returns at once; a larger one is sent from its memory, and the
# tell returns once ZeroMQ has let go of it. Waiting costs ~0.15 ms a tell (pyzmq's garbage-collector thread says
# when), a copy ~0.1 ms per MiB: up to 4 MiB copying is as fast or faster (bench/array_tells.py, docs/performance.md)
TELL_COPY_MAX = 4 << 20
_ALWAYS = 1 << 62  # copy_below for replies: every writable array


def context() -> zmq.Context:
    global _ctx
    if _ctx is None or _ctx.closed:
        _ctx = zmq.Context()
    return _ctx


@dataclass
class MailboxConfig:
    """Sizes and limits of one mailbox. Defaults suit a job of tens of actors on one host or a cluster."""

    max_message_bytes: int = 1 << 30          # whole message (all frames); larger sends fail, larger frames drop
    send_hwm: int = 1000                      # messages queued per peer connection before a send waits
    recv_hwm: int = 1000                      # messages queued at our ROUTER before the peer's sends wait
    max_inflight_asks: int = 256              # asks to one peer without a reply yet; more wait for credit
    max_concurrency: int = 256                # handlers running at once; past it the ROUTER stops reading
    default_timeout: float = 60.0             # ask deadline when the caller gives none
    linger_ms: int = 1000                     # how long close() waits for unsent messages
    recv_batch: int = 256                     # messages read per wake-up before yielding to other work
    malloc_keep_mib: int = 256                # glibc: freed memory kept for reuse by large messages (allocator.py)


class Inbound:
    """A request as the actor sees it: decoded header, raw header and body bytes, array frames, reply route.

    `t_ns` is the arrival time when the mailbox left the request's `recv` trace record to the handler side (see
    Mailbox.defer_recv_trace), else 0."""

    __slots__ = ("header", "header_bytes", "body_bytes", "arrays", "identity", "t_ns", "kept")

    def __init__(self, header: dict, header_bytes: bytes, body_bytes: bytes, arrays: list, identity: bytes,
                 t_ns: int = 0, kept: list | None = None):
        self.header, self.header_bytes, self.body_bytes = header, header_bytes, body_bytes
        self.arrays, self.identity, self.t_ns = arrays, identity, t_ns
        self.kept = kept  # copies of the arrays as they arrived, for a trace that keeps arrays (Mailbox._arrived)


class _Sock:
    """An event-loop-driven ZMQ socket: drains input when readable, wakes senders when writable.

    ZMQ_FD is edge-triggered and readable for any command, not only for messages. Two entry points:

    * `on_fd` -- the loop saw the FD readable. Nearly always a message has arrived, so it is read at once
      (recv runs the socket's pending commands itself when its pipe looks empty); ZMQ_EVENTS (a syscall, ~0.9 us)
      is asked first only when senders wait for room. A wake-up without a message costs one zmq.Again.
    * `ready` -- a re-check scheduled by `kick` (after a send, or when resuming): asks ZMQ_EVENTS first, since
      here a message is the exception.

    After each message ZMQ_EVENTS says whether another is queued; that check also runs the commands that a send
    made while handling may have left, so no edge is lost.
    """

    __slots__ = ("sock", "on_message", "loop", "writers", "scheduled", "paused", "closed", "fd", "batch",
                 "router", "in_ready", "send", "wakeups", "spurious")

    def __init__(self, sock: zmq.Socket, loop: asyncio.AbstractEventLoop, on_message: Callable, batch: int,
                 router: bool):
        self.sock, self.loop, self.on_message, self.batch = sock, loop, on_message, batch
        self.router = router  # frames: [routing id, header, body, arrays...] (ROUTER) or [header, body, arrays...]
        self.writers: list[asyncio.Future] = []
        self.scheduled = False
        self.paused = False
        self.closed = False
        self.in_ready = False
        self.wakeups = 0   # FD wake-ups
        self.spurious = 0  # ... that found no message
        self.send = partial(_backend_send, sock)
        self.fd = sock.getsockopt(zmq.FD)
        loop.add_reader(self.fd, self.on_fd)

    def on_fd(self) -> None:
        if self.closed or self.in_ready:
            return
        self.wakeups += 1
        if self.writers or self.paused:
            self.ready()
        else:
            self._drain(True)

    def ready(self) -> None:
        self.scheduled = False
        if self.closed or self.in_ready:
            return
        try:
            events = self.sock.getsockopt(EVENTS)
        except zmq.ZMQError:
            return
        if events & POLLOUT and self.writers:
            writers, self.writers = self.writers, []
            for w in writers:
                if not w.done():
                    w.set_result(None)
        if events & POLLIN and not self.paused:
            self._drain(False)

    def _drain(self, from_fd: bool) -> None:
        """Read and dispatch queued messages (at most `batch`), then come back later if more may be queued.

        Checking for a next message costs either ZMQ_EVENTS (a syscall, ~0.9 us on the project VM) or, when there is
        none, a raised zmq.Again (~2.5 us). So: after the first message ask ZMQ_EVENTS; once two have been read
        there is a backlog, and reading on until zmq.Again is cheaper than a ZMQ_EVENTS per message. When a message
        read straight off an FD wake-up resolves an ask, the check is left to `ready` after the woken task has run:
        the asker gets its answer one syscall sooner, and that check merges with the one its next send schedules.
        """
        sock = self.sock
        on_message, recv, get, router = self.on_message, sock.recv, sock.getsockopt, self.router
        self.in_ready = True
        n = 0
        try:
            while True:
                try:
                    if router:
                        ident = recv(NOBLOCK)  # the routing id: always followed by the peer's first frame
                    else:
                        ident = None
                        head = recv(NOBLOCK, copy=False)
                except zmq.ZMQError:  # zmq.Again: nothing queued (recv ran the pending commands: no edge lost)
                    if from_fd and n == 0:
                        self.spurious += 1
                    return
                try:
                    # Header and body are read as Frames for Frame.more, a flag of the message itself:
                    # getsockopt(RCVMORE) costs ~0.6 us (pyzmq builds a SocketOption enum per call). They are small
                    # and .bytes copies them; array frames stay zero-copy.
                    if router:
                        head = recv(0, copy=False)
                    if head.more:
                        body = recv(0, copy=False)
                        more = body.more
                        frames = [head.bytes, body.bytes] if ident is None else [ident, head.bytes, body.bytes]
                        while more:
                            f = recv(0, copy=False)
                            frames.append(f)
                            more = f.more
                    else:
                        frames = [head.bytes] if ident is None else [ident, head.bytes]
                except zmq.ZMQError:
                    return
                n += 1
                try:
                    woke = on_message(frames)
                except Exception as exc:  # a bug in a callback must not stall the socket (the edge is consumed)
                    self.loop.call_exception_handler({"message": "mailbox: handling a message failed",
                                                      "exception": exc})
                    woke = False
                if self.paused or self.closed:
                    return
                if n >= self.batch or (woke and from_fd and n == 1):
                    break
                if n == 1:
                    try:
                        if not get(EVENTS) & POLLIN:
                            return
                    except zmq.ZMQError:
                        return
        finally:
            self.in_ready = False
        self.kick()  # more may be queued: come back after other work has had a turn

    def kick(self) -> None:
        """Re-check the socket soon: ZMQ_FD is edge-triggered, and a send can consume the edge of an arrival.

        Inside a drain the check after each message does this already."""
        if not self.scheduled and not self.closed and not self.in_ready:
            self.scheduled = True
            self.loop.call_soon(self.ready)

    async def writable(self) -> None:
        fut = self.loop.create_future()
        self.writers.append(fut)
        self.kick()
        # the FD is edge-triggered; poll as a safety net while waiting for room
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(fut), 0.05)
                return
            except asyncio.TimeoutError:
                if self.closed:
                    raise MailboxError("socket closed while waiting to send") from None
                self.kick()

    def close(self, linger_ms: int) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.loop.remove_reader(self.fd)
        except (ValueError, OSError):
            pass
        for w in self.writers:
            if not w.done():
                w.set_exception(MailboxError("socket closed"))
        self.sock.close(linger=linger_ms)


class _Peer:
    __slots__ = ("name", "endpoint", "sock", "seq", "inflight", "max_inflight", "waiting")

    def __init__(self, name: str, endpoint: str, sock: _Sock, max_inflight: int):
        self.name, self.endpoint, self.sock = name, endpoint, sock
        self.seq = 0
        self.inflight = 0  # asks sent to this peer and not answered yet
        self.max_inflight = max_inflight
        self.waiting: list[asyncio.Future] = []  # asks waiting for credit

    def release(self) -> None:
        self.inflight -= 1
        while self.waiting:
            w = self.waiting.pop(0)
            if not w.done():
                w.set_result(None)
                break


class _Released:
    """Makes a tell's large writable arrays safe to change once the tell returns: each is wrapped in a memoryview of
    its own, which pyzmq keeps alive until libzmq has written the frame out and freed it (its garbage-collector
    thread drops it then); a weak reference to the view resolves `future` when the last one is gone. The callback
    runs on pyzmq's thread (or on ours), so it hands over to the loop."""

    __slots__ = ("loop", "future", "left", "refs")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.future = loop.create_future()
        self.left = 0
        self.refs = []

    def wrap(self, b: memoryview) -> memoryview:
        b = memoryview(b)
        self.refs.append(weakref.ref(b, self._gone))
        self.left += 1
        return b

    def _gone(self, _ref) -> None:
        try:
            self.loop.call_soon_threadsafe(self._count)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _count(self) -> None:
        self.left -= 1
        if self.left <= 0 and not self.future.done():
            self.future.set_result(None)


class _Pending:
    __slots__ = ("future", "peer", "method", "deadline", "timeout")

    def __init__(self, future, peer, method, deadline, timeout):
        self.future, self.peer, self.method, self.deadline, self.timeout = future, peer, method, deadline, timeout


Resolver = Callable[[str], Awaitable[str]]


class Mailbox:
    """Sends and receives envelopes for one actor. `on_request(Inbound)` is called for every tell/ask/heartbeat."""

    def __init__(self, name: str, *, resolver: Resolver | None = None, keys: JobKeys | None = None,
                 tracer: Tracer | None = None, config: MailboxConfig | None = None,
                 on_request: Callable[[Inbound], None] | None = None,
                 on_drop: Callable[[str, bytes | None], None] | None = None):
        self.name = name
        self.config = config or MailboxConfig()
        allocator.keep_freed(self.config.malloc_keep_mib)
        self.keys = keys
        self.tracer = tracer
        self.resolver = resolver
        self.on_request = on_request or (lambda inbound: None)
        self.on_drop = on_drop or (lambda reason, identity: None)
        self.endpoint: str | None = None
        self.stats = {"sent": 0, "received": 0, "replies": 0, "dropped": 0, "late_replies": 0}
        self._peers: dict[str, _Peer] = {}
        self._connecting: dict[str, asyncio.Future] = {}
        self._pending: dict[str, _Pending] = {}
        self._router: _Sock | None = None
        self._seq_out: dict[bytes, int] = {}  # reply seq per requesting connection
        self._routing_id = f"{name}#{os.getpid()}#{os.urandom(3).hex()}".encode()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._body_encoder = codec.BodyEncoder()
        self._header_packer = msgpack.Packer(use_bin_type=True)
        # Ask deadlines: one loop timer for the earliest deadline instead of a timer per ask (see _sweep).
        self._sweep_at: float | None = None
        self._sweep_handle: asyncio.TimerHandle | None = None
        # Tracing, a plug-in (tracing.py): a tracer with the hot path's entries gets the record of bytes packed onto
        # its queue at once, one with arrays or a body over the limit queued as a tuple it finishes later.
        self._trace, _, self._trec = fast_entries(tracer)  # None: a tracer without them, record() below
        self._tlimit = getattr(tracer, "body_limit", 0) if self._trace is not None else -1
        # Traced: array frames are checksummed once, here, before they are sent, and the checksums travel in the
        # header (`sums`) so that a traced receiver records them instead of computing its own; the trace records
        # then hold the checksums, not the buffers (unless it keeps arrays: docs/trace-format.md).
        self.sums = ArraySums() if tracer is not None else None
        # Replies kept in the trace in full though over its body limit: method -> (the bound in bytes, what an input
        # marker says above it). The trainer's batch (get_batch's or wait_batch's reply): replay trains on it.
        # Recorded as it came in, nothing encoded again; above the bound by size and checksum, with an input
        # {"__omitted__": true, "size", "why"} named after the method that replay reports.
        self.full_replies: dict[str, tuple[int, str]] = {}
        self._keep_arrays = bool(getattr(tracer, "keep_arrays", False))
        # Set by an owner that records each request's arrival itself, together with its handling when that is
        # synchronous (one trace record instead of two): the mailbox then only stamps Inbound.t_ns.
        self.defer_recv_trace = False

    # ------------------------------------------------------------------------------------------ set-up/teardown
    async def bind(self, endpoint: str) -> str:
        """Bind the ROUTER (e.g. ``ipc:///tmp/a.sock`` or ``tcp://0.0.0.0:0``); returns the endpoint peers use."""
        self._loop = asyncio.get_running_loop()
        ctx = context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # a peer that reconnects (a new DEALER after a cut link; its routing id is the same) takes over its old,
        # half-dead connection instead of being refused until TCP notices the old one is gone
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.setsockopt(zmq.RCVHWM, self.config.recv_hwm)
        sock.setsockopt(zmq.SNDHWM, self.config.send_hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        sock.setsockopt(zmq.LINGER, self.config.linger_ms)
        if self.keys is not None:
            Authenticator.ensure(ctx, self.keys.public)
            self.keys.apply_server(sock)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise MailboxError(f"{self.name}: cannot bind {endpoint}: {exc}") from None
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._router = _Sock(sock, self._loop, self._on_router, self.config.recv_batch, True)
        return self.endpoint

    def pause_receiving(self, paused: bool) -> None:
        """Stop (or resume) reading requests: queued ones stay in ZMQ, and senders block at their HWM."""
        if self._router is None:
            return
        self._router.paused = paused
        if not paused:
            self._router.kick()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        for p in list(self._pending.values()):
            if not p.future.done():
                p.future.set_exception(MailboxError(f"{self.name} closed while waiting for {p.peer}.{p.method}"))
        self._pending.clear()
        for peer in self._peers.values():
            peer.sock.close(self.config.linger_ms)
        self._peers.clear()
        if self._router is not None:
            self._router.close(self.config.linger_ms)

    # ------------------------------------------------------------------------------------------ peers
    async def _peer(self, name: str) -> _Peer:
        peer = self._peers.get(name)
        if peer is not None:
            return peer
        waiting = self._connecting.get(name)
        if waiting is not None:
            return await asyncio.shield(waiting)
        fut = self._loop.create_future()
        self._connecting[name] = fut
        try:
            if self.resolver is None:
                raise UnknownPeer(f"{self.name} has no directory to find {name!r}")
            endpoint = await self.resolver(name)
            peer = self.connect(name, endpoint)
            fut.set_result(peer)
            return peer
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        finally:
            self._connecting.pop(name, None)

    def connect(self, name: str, endpoint: str) -> _Peer:
        """Open (or reopen, if the endpoint changed) the connection to a named peer."""
        old = self._peers.get(name)
        if old is not None:
            if old.endpoint == endpoint:
                return old
            self.disconnect(name)
        sock = context().socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, self._routing_id)
        sock.setsockopt(zmq.SNDHWM, self.config.send_hwm)
        sock.setsockopt(zmq.RCVHWM, self.config.recv_hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        sock.setsockopt(zmq.LINGER, self.config.linger_ms)
        sock.setsockopt(zmq.IMMEDIATE, 0)
        if self.keys is not None:
            self.keys.apply_client(sock)
        sock.connect(endpoint)
        peer = _Peer(name, endpoint, None, self.config.max_inflight_asks)
        peer.sock = _Sock(sock, self._loop, partial(self._on_dealer, name), self.config.recv_batch, False)
        self._peers[name] = peer
        return peer

    def disconnect(self, name: str, reason: str = "declared down") -> None:
        """Forget a peer's connection and fail the asks waiting on it (it died, or moved to a new endpoint)."""
        peer = self._peers.pop(name, None)
        if peer is not None:
            peer.sock.close(0)
        for mid, p in list(self._pending.items()):
            if p.peer == name:
                del self._pending[mid]
                if not p.future.done():
                    p.future.set_exception(PeerDown(name, p.method, reason))

    def peers(self) -> dict[str, str]:
        return {n: p.endpoint for n, p in self._peers.items()}

    # ------------------------------------------------------------------------------------------ sending
    def _encode(self, header: list | dict, body: Any, host_copy: bool):
        """Encode a message: `header` is a version-2 array (codec.header_v2) or, to a version-1 asker, a map."""
        body_bytes, buffers, refs = self._body_encoder.encode(body, host_copy)
        if buffers:
            sums = self.sums.for_send(buffers, refs) if self.sums is not None else None
            if type(header) is list:
                header[13] = len(buffers)
                if sums is not None:
                    header.append(sums)  # [14], codec.SUMS_AT
            else:
                header["nframes"] = len(buffers)  # a version-1 peer: no sums (it would ignore them)
            total = sum(r.nbytes for r in refs)
        else:
            total = 0
        header_bytes = self._header_packer.pack(header)
        total += len(header_bytes) + len(body_bytes)
        if total > self.config.max_message_bytes:
            method, to = (header[6], header[5]) if type(header) is list else (header["method"], header["to"])
            raise MessageTooLarge(f"{method} to {to}: message is {total} bytes, over the "
                                  f"{self.config.max_message_bytes}-byte limit")
        return header_bytes, body_bytes, buffers, refs

    @staticmethod
    def _try_send(sock: _Sock, head: bytes | None, header_bytes: bytes, body_bytes: bytes, buffers: list,
                  copy_below: int = 0) -> bool:
        """Send without waiting; False if the peer's queue is full (nothing was sent). Array frames of
        ZERO_COPY_MIN bytes and more are sent from the caller's memory, except writable ones smaller than
        copy_below, which are copied (tells and replies: see tell and reply_nowait)."""
        send = sock.send
        try:
            if head is not None:
                send(head, SEND_MORE_NOW)
                send(header_bytes, SNDMORE)
            else:
                send(header_bytes, SEND_MORE_NOW)
        except zmq.Again:
            return False
        # ZMQ queues a multipart message atomically once its first frame is accepted
        if buffers:
            send(body_bytes, SNDMORE)
            last = len(buffers) - 1
            for i, b in enumerate(buffers):
                n = len(b)
                send(b, 0 if i == last else SNDMORE, copy=n < ZERO_COPY_MIN or (n < copy_below and not b.readonly))
        else:
            send(body_bytes, 0)
        sock.kick()
        return True

    def _sent(self, header_bytes, body_bytes, refs, buffers) -> None:
        if self._trace is not None:
            if not refs and len(body_bytes) <= self._tlimit:
                self._trec("send", _time_ns(), header_bytes, body_bytes)
            else:
                # refs hold the checksums; a trace that keeps arrays copies the writable ones now: the writer thread
                # gets to them later, when the caller may have changed them
                kept = _frozen(buffers) if self._keep_arrays and buffers else None
                self._trace(("send", _time_ns(), header_bytes, body_bytes, refs, kept, None))
        elif self.tracer is not None:
            self.tracer.record("send", header_bytes, body_bytes, refs, buffers)
        self.stats["sent"] += 1

    def _arrived(self, header: dict, arrays: list) -> list | None:
        """Traced, as a message with arrays arrives -- before a handler or an awaiting task can change them (a received
        torch tensor is writable): the checksums its sender declared are remembered, or computed now and set as the
        header's `sums` when it declared none. Returns copies of the arrays for a trace that keeps them (the writer
        thread gets to its records later), else None."""
        sums = header.get("sums")
        bufs = [codec.frame_buffer(f) for f in arrays] if sums is None or self._keep_arrays else None
        if sums is None:
            header["sums"] = sums = self.sums.of_frames(bufs)
        self.sums.received(arrays, sums)
        return [bytes(b) for b in bufs] if self._keep_arrays else None

    def recv_arrays(self, header: dict, arrays: list, kept: list | None = None) -> tuple[list[ArrayRef] | None,
                                                                                     list | None]:
        """(refs, buffers) for the trace record of a received message: the refs hold its checksums (the header's
        `sums`, which _arrived set), the buffers are the copies `kept` of a trace that keeps arrays."""
        if not arrays:
            return None, None
        return _refs_of(arrays, header["sums"]), kept

    async def _send_later(self, sock: _Sock, head: bytes | None, hb: bytes, bb: bytes, buffers: list,
                          copy_below: int = 0) -> None:
        while not self._try_send(sock, head, hb, bb, buffers, copy_below):
            await sock.writable()

    async def _send(self, sock: _Sock, head: list, header: dict, body: Any, host_copy: bool) -> None:
        hb, bb, buffers, refs = self._encode(header, body, host_copy)
        if not self._try_send(sock, None, hb, bb, buffers):
            await self._send_later(sock, None, hb, bb, buffers)
        self._sent(hb, bb, refs, buffers)

    async def tell(self, to: str, method: str, body: Any = None, *, host_copy: bool = False) -> str:
        """Send a one-way message. Returns the message id once it is queued (waiting while the peer's queue is full),
        and the caller may then change the arrays it sent: a writable one is copied if smaller than TELL_COPY_MAX,
        else sent from its memory and the tell returns once ZeroMQ has written it out. A read-only array is sent
        from its memory without waiting (read-only: nothing changes it)."""
        peer = self._peers.get(to) or await self._peer(to)
        peer.seq += 1
        cause = current_cause.get()
        if cause is None:
            header = codec.header_v2("tell", self.name, to, method, peer.seq, codec.new_trace_id(), None)
        else:
            header = codec.header_v2("tell", self.name, to, method, peer.seq, cause[0], cause[1])
        hb, bb, buffers, refs = self._encode(header, body, host_copy)
        sock = peer.sock
        if buffers:
            await self._tell_arrays(sock, hb, bb, buffers, refs)
            return header[2]
        if not self._try_send(sock, None, hb, bb, buffers):
            await self._send_later(sock, None, hb, bb, buffers)
        self._sent(hb, bb, refs, buffers)
        return header[2]

    async def _tell_arrays(self, sock: _Sock, hb: bytes, bb: bytes, buffers: list, refs: list) -> None:
        """A tell with arrays: writable ones under TELL_COPY_MAX are copied, larger ones waited for (see tell)."""
        released = None
        frames = buffers
        for i, b in enumerate(buffers):
            if len(b) >= TELL_COPY_MAX and not b.readonly:
                if released is None:
                    released, frames = _Released(self._loop), list(buffers)
                frames[i] = released.wrap(b)
        if not self._try_send(sock, None, hb, bb, frames, TELL_COPY_MAX):
            await self._send_later(sock, None, hb, bb, frames, TELL_COPY_MAX)
        frames = None  # (the wrapped frames' last holder must be ZeroMQ)
        self._sent(hb, bb, refs, buffers)
        if released is not None:
            await released.future

    async def ask(self, to: str, method: str, body: Any = None, *, timeout: float | None = None,
                  idem: str | None = None, host_copy: bool = False) -> Any:
        """Send a request and wait for its reply body. Raises AskTimeout, RemoteError or PeerDown.

        `timeout` bounds the whole ask: waiting for credit (asks in flight to the peer) and for room in its queue as
        well as for the reply; the receiver sees what is left of it as the header's deadline."""
        timeout = self.config.default_timeout if timeout is None else timeout
        peer = self._peers.get(to) or await self._peer(to)
        loop = self._loop
        deadline = loop.time() + timeout
        left = timeout
        if peer.inflight >= peer.max_inflight:
            await self._wait_credit(peer, method, timeout, deadline)
            left = max(0.0, deadline - loop.time())
        peer.inflight += 1
        try:
            peer.seq += 1
            cause = current_cause.get()
            trace, parent = (codec.new_trace_id(), None) if cause is None else cause
            header = codec.header_v2("ask", self.name, to, method, peer.seq, trace, parent, _time() + left, idem)
            hb, bb, buffers, refs = self._encode(header, body, host_copy)
            sock = peer.sock
            if not self._try_send(sock, None, hb, bb, buffers):
                # the peer's queue is full: wait for room, but not past the ask's deadline (waiting for room
                # cannot be interrupted half-way through a message: it is queued whole or not at all)
                try:
                    await asyncio.wait_for(self._send_later(sock, None, hb, bb, buffers),
                                           max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    raise AskTimeout(to, method, timeout) from None
            # Registered once sent: the reply can only be read by a later turn of the loop (this task has not
            # yielded since the send), and the bookkeeping then runs while the message travels, not before it.
            fut = loop.create_future()
            self._pending[header[2]] = _Pending(fut, to, method, deadline, timeout)
            if self._sweep_at is None or deadline < self._sweep_at:
                self._arm(deadline)
            self._sent(hb, bb, refs, buffers)
            return await fut
        finally:
            peer.release()

    async def _wait_credit(self, peer: _Peer, method: str, timeout: float, deadline: float) -> None:
        while peer.inflight >= peer.max_inflight:
            w = self._loop.create_future()
            peer.waiting.append(w)
            left = deadline - self._loop.time()
            if left <= 0:
                raise AskTimeout(peer.name, method, timeout)
            try:
                await asyncio.wait_for(w, left)
            except asyncio.TimeoutError:
                raise AskTimeout(peer.name, method, timeout) from None

    def _arm(self, deadline: float) -> None:
        """(Re)schedule the deadline sweep for `deadline` (loop time), the earliest of the asks waiting."""
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        self._sweep_at = deadline
        self._sweep_handle = self._loop.call_at(deadline, self._sweep)

    def _sweep(self) -> None:
        """Fail every ask whose deadline has passed, then sleep until the next deadline.

        One timer per mailbox instead of one per ask: the sweep runs when the earliest deadline it knew of comes
        due (asks answered before then cost nothing), and scans the asks still waiting."""
        self._sweep_handle = None
        self._sweep_at = None
        now = self._loop.time() + 0.001  # timers may fire up to a clock tick early
        nxt = None
        expired = []
        for mid, p in self._pending.items():
            if p.deadline <= now:
                expired.append(mid)
            elif nxt is None or p.deadline < nxt:
                nxt = p.deadline
        for mid in expired:
            p = self._pending.pop(mid)
            if not p.future.done():
                p.future.set_exception(AskTimeout(p.peer, p.method, p.timeout))
        if nxt is not None and not self._closed:
            self._arm(nxt)

    def _reply_parts(self, inbound: Inbound, body: Any, error: dict | None, host_copy: bool):
        req = inbound.header
        seq = self._seq_out.get(inbound.identity, 0) + 1
        self._seq_out[inbound.identity] = seq
        rid = req.get("id")
        # answered in the asker's version: a version-1 client gets a map, everyone else the array
        make = codec.make_header if req.get("v") == 1 else codec.header_v2
        header = make("reply" if error is None else "error", self.name, req.get("from", "?"), req.get("method", ""),
                      seq, req.get("trace") or codec.new_trace_id(), rid, None, None, rid or "")
        try:
            return self._encode(header, body if error is None else error, host_copy)
        except (TypeError, MessageTooLarge) as exc:
            if error is not None:
                raise
            err = {"type": type(exc).__name__, "message": f"reply cannot be sent: {exc}", "peer": self.name,
                   "method": req.get("method", "")}
            return self._reply_parts(inbound, None, err, False)

    def reply_nowait(self, inbound: Inbound, body: Any = None, *, error: dict | None = None,
                     host_copy: bool = False):
        """Answer an ask now if the asker's queue has room. Returns None when sent, else a coroutine to await.

        A writable array in a reply is sent as a copy: the actor goes on with its next message at once and may
        change it (a handler that answers with a view of its own storage). A read-only one -- received and passed
        on, or marked read-only by the handler -- is sent from its memory."""
        hb, bb, buffers, refs = parts = self._reply_parts(inbound, body, error, host_copy)
        try:
            if self._try_send(self._router, inbound.identity, hb, bb, buffers, _ALWAYS):
                self._sent(hb, bb, refs, buffers)
                return None
        except zmq.ZMQError as exc:
            self._reply_lost(inbound, exc)
            return None
        if buffers:  # sent later: the copies are taken now, as the handler returned them
            parts = (hb, bb, _frozen(buffers), refs)
        return self._reply_later(inbound, parts)

    async def _reply_later(self, inbound: Inbound, parts) -> None:
        hb, bb, buffers, refs = parts
        try:
            while not self._try_send(self._router, inbound.identity, hb, bb, buffers, _ALWAYS):
                await self._router.writable()
        except zmq.ZMQError as exc:
            self._reply_lost(inbound, exc)
            return
        self._sent(hb, bb, refs, buffers)

    async def reply(self, inbound: Inbound, body: Any = None, *, error: dict | None = None,
                    host_copy: bool = False) -> None:
        """Answer an ask over the connection it came in on (kind reply, or error when `error` is given)."""
        later = self.reply_nowait(inbound, body, error=error, host_copy=host_copy)
        if later is not None:
            await later

    def _reply_lost(self, inbound: Inbound, exc: Exception) -> None:
        # EHOSTUNREACH: the asker's connection is gone
        req = inbound.header
        self.stats["dropped"] += 1
        self.on_drop(f"reply to {req.get('from')} for {req.get('method')} not delivered: {exc}", inbound.identity)

    def reply_error_raw(self, identity: bytes, message: str) -> None:
        """Answer a message we could not decode (no usable header): an error with re="" (best effort), in version 1
        (a map): its sender's version is unknown, and every version reads that."""
        header = codec.make_header("error", self.name, "?", "", 0, codec.new_trace_id(), None, re="")
        body = {"type": "ProtocolError", "message": message, "peer": self.name, "method": ""}
        try:
            self._try_send(self._router, identity, codec.pack_header(header), codec.encode_body(body)[0], [])
        except zmq.ZMQError:
            pass

    # ------------------------------------------------------------------------------------------ receiving
    def _drop(self, reason: str, identity: bytes | None, frames=None) -> None:
        self.stats["dropped"] += 1
        if self.tracer is not None:
            self.tracer.record("drop", None, None, extra={"reason": reason[:500],
                                                          "identity": bytes(identity or b"")[:64].hex(),
                                                          "size": sum(len(f) for f in frames or ())})
        self.on_drop(reason, identity)

    def _on_router(self, frames: list) -> None:
        identity = frames[0]
        n = len(frames)
        if n < 3:
            self._drop(f"expected identity, header and body frames, got {n} frame(s)", identity, frames)
            self.reply_error_raw(identity, f"expected header and body frames, got {n - 1} frame(s)")
            return
        header_bytes = frames[1]
        try:
            header = codec.decode_header(header_bytes)
            if header["kind"] not in _INBOUND_KINDS:
                raise ProtocolError(f"a {header['kind']} cannot be sent to a mailbox (only tell, ask, hb)")
            nf = header.get("nframes", 0)
            if nf != n - 3:
                raise ProtocolError(f"header says {nf} array frame(s), message has {n - 3}")
        except ProtocolError as exc:
            self._drop(str(exc), identity, frames)
            self.reply_error_raw(identity, str(exc))
            return
        self.stats["received"] += 1
        arrays = frames[3:]
        kept = self._arrived(header, arrays) if arrays and self.sums is not None else None
        if self.defer_recv_trace:
            self.on_request(Inbound(header, header_bytes, frames[2], arrays, identity, _time_ns(), kept))
            return
        if self._trace is not None:
            body = frames[2]
            if not arrays and len(body) <= self._tlimit:
                self._trec("recv", _time_ns(), header_bytes, body)
            else:
                refs, bufs = self.recv_arrays(header, arrays, kept)
                self._trace(("recv", _time_ns(), header_bytes, body, refs, bufs, None))
        elif self.tracer is not None:
            self.tracer.record("recv", header_bytes, frames[2], *self.recv_arrays(header, arrays, kept))
        self.on_request(Inbound(header, header_bytes, frames[2], arrays, identity))

    def _trace_full_reply(self, method: str, header, body) -> None:
        """A reply over the trace's body limit to a method in `full_replies`: recorded in full up to its bound (a
        finished record: the writer keeps its body), above it by size and checksum and an input marker."""
        bound, why = self.full_replies[method]
        if len(body) <= bound:
            self._trace(("recv", _time_ns(), bytes(header), bytes(body), len(body), None, None, None))
            return
        self._trace(("recv", _time_ns(), header, body, [], None, None))
        record_input = getattr(self.tracer, "record_input", None)
        if record_input is not None:
            record_input(method, {"__omitted__": True, "size": len(body), "why": why})

    def _on_dealer(self, peer: str, frames: list) -> None:
        try:
            if len(frames) < 2:
                raise ProtocolError(f"expected header and body frames, got {len(frames)}")
            header = codec.decode_header(frames[0])
            if header["kind"] not in _RESPONSE_KINDS:
                raise ProtocolError(f"got a {header['kind']} on a reply connection")
        except ProtocolError as exc:
            self._drop(f"from {peer}: {exc}", None, frames)
            return
        arrays = frames[2:]
        kept = self._arrived(header, arrays) if arrays and self.sums is not None else None
        p = self._pending.pop(header["re"], None)
        # a reply whose ask already timed out is traced marked `late`: a replay then times the ask out as the run did
        # instead of answering it with this reply
        late = {LATE: True} if p is None else None
        if self._trace is not None:
            body = frames[1]
            if late is None and not arrays and len(body) <= self._tlimit:
                self._trec("recv", _time_ns(), frames[0], body)
            elif late is None and not arrays and p.method in self.full_replies:
                self._trace_full_reply(p.method, frames[0], body)
            else:
                refs, bufs = self.recv_arrays(header, arrays, kept)
                self._trace(("recv", _time_ns(), frames[0], body, refs, bufs, late))
        elif self.tracer is not None:
            self.tracer.record("recv", frames[0], frames[1], *self.recv_arrays(header, arrays, kept), extra=late)
        self.stats["replies"] += 1
        if p is None:
            self.stats["late_replies"] += 1  # its ask timed out, or a duplicate
            return
        fut = p.future
        if fut.done():
            return
        try:
            body = codec.decode_body(frames[1], arrays)
        except ProtocolError as exc:
            fut.set_exception(ProtocolError(f"reply from {peer} to {p.method}: {exc}"))
            return True
        if header["kind"] == "error":
            e = body if isinstance(body, dict) else {"message": str(body)}
            fut.set_exception(RemoteError(str(e.get("peer", peer)), str(e.get("method", p.method)),
                                          str(e.get("type", "Error")), str(e.get("message", "")),
                                          e.get("traceback")))
        else:
            fut.set_result(body)
        return True  # an asker was woken

    async def heartbeat(self, to: str, body: Any) -> None:
        """A liveness message (kind hb) to `to`; never waits for an answer."""
        peer = await self._peer(to)
        peer.seq += 1
        header = codec.header_v2("hb", self.name, to, "heartbeat", peer.seq, codec.new_trace_id(), None)
        await self._send(peer.sock, [], header, body, False)


_INBOUND_KINDS = frozenset(("tell", "ask", "hb"))
_RESPONSE_KINDS = frozenset(codec.RESPONSE_KINDS)
_time = time.time
_time_ns = time.time_ns


def _frozen(buffers: list) -> list:
    """The buffers as they are now: read-only ones as they are (nothing changes them), copies of writable ones."""
    return [b if b.readonly else memoryview(bytes(b)) for b in buffers]


def _refs_of(arrays: list, sums: list) -> list[ArrayRef]:
    # the body names dtype and shape; the trace only needs sizes and checksums here, the reader decodes the rest
    return [ArrayRef(i, "bytes", (len(a),), "raw", len(a), s) for i, (a, s) in enumerate(zip(arrays, sums))]


def unpack_error(exc: BaseException, peer: str, method: str, with_traceback: bool = True) -> dict:
    import traceback
    body = {"type": type(exc).__name__, "message": str(exc), "peer": peer, "method": method}
    if with_traceback:
        body["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
    return body
