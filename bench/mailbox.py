"""Mailbox benchmark (issue 2): slime-actors against raw pyzmq+msgpack (the floor) and Ray, in one run.

    .venv/bin/python bench/mailbox.py            (or `make bench`; --quick for a short run, --no-ray to skip Ray)

Every variant is two processes on this machine -- this driver and one server process:

    raw        a blocking pyzmq DEALER here, a blocking ROUTER loop there; bodies msgpack, arrays as zero-copy frames;
               both processes with the malloc settings a mailbox applies (slime_actors/mailbox/allocator.py), so
               the floor does not pay for page faults that slime's processes are spared
    loop       raw's messages, but both ends on a uvloop event loop (add_reader on the sockets' ZMQ_FD, a future per
               ask): no envelope, no actor, no tracing -- what any asyncio mailbox pays before it does anything, so
               the gap between raw and slime reads as the event loop's share and slime's own
    slime      a client actor here, an echo actor there (ipc://, CURVE off), tracing on (the default) or off
    Ray        ray.get on an actor's method, from a driver process of its own (Ray's own daemons run too: that is what
               a Ray actor call costs; its driver threads are kept out of the process the other clients run in)

Figures: ask round trip of a small body (sequential), pipelined one-way messages per second (tells sent back to
back, then one ask that is answered after all of them: per-sender FIFO), and the round trip of a 16 MiB float32 numpy
array. raw, loop and slime are interleaved -- each round runs every variant once, in a rotating order -- and the table
shows the median over rounds, so a burst of noise from other work on the machine hits all of them alike. A ratio
between two interleaved variants is the median of the per-round ratios, with their range, and its verdict says
whether every round met the target (PASS), the median did but some rounds did not (BORDERLINE), or the median did not
(MISS). Ray's rounds run after those, while its daemons are up (they take CPU from whatever runs beside them).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import msgpack
import numpy as np
import zmq

from slime_actors.actors.base import Actor, handler
from slime_actors.mailbox import allocator
from slime_actors.mailbox.mailbox import MailboxConfig
from slime_actors.runtime import RuntimeConfig

BIG_SHAPE = (4 << 20,)  # 4 Mi float32 = 16 MiB


# ------------------------------------------------------------------------------------------------ servers
class BenchEcho(Actor):
    role = "bench"

    def __init__(self, index=0, **config):
        super().__init__(index, **config)
        self.received = 0

    @handler
    def echo(self, x=None):
        return x

    @handler
    def sink(self, x=None) -> None:
        self.received += 1

    @handler
    def count(self) -> int:
        return self.received

    @handler
    def flush(self) -> None:
        """Write out what tracing still holds (array checksums included): the end of a timed run."""
        if self.tracer is not None:
            self.tracer.flush()


class BenchClient(Actor):
    role = "client"


def _pin(cpus) -> None:
    """Keep this process (and the threads it starts: ZMQ's I/O thread, the trace writer) on these CPUs."""
    if cpus:
        os.sched_setaffinity(0, cpus)


def _slime_server(run_dir: str, index: int, trace: bool, ready, cpus=None) -> None:
    _pin(cpus)
    import uvloop

    from slime_actors.log import setup_logging
    setup_logging(run_dir, f"bench/{index}", console=False, level="warning")

    async def main():
        actor = BenchEcho(index)
        await actor.start(RuntimeConfig(run_dir=run_dir, curve=False, trace=trace))
        ready.put(actor.endpoint)
        await actor.wait_stopped()

    uvloop.run(main())


def _raw_server(endpoint: str, ready, cpus=None) -> None:
    """Blocking ROUTER: [id, body] -> echo (or count a {'t': ...} tell, or answer {'sync': 1} with the count);
    [id, meta, data] -> the array echoed back zero-copy, after viewing it as a numpy array."""
    _pin(cpus)
    allocator.keep_freed(MailboxConfig().malloc_keep_mib)
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(endpoint)
    ready.put(endpoint)
    count = 0
    unpackb, packb = msgpack.unpackb, msgpack.packb
    while True:
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 2:
            body = unpackb(frames[1].bytes)
            if "t" in body:
                count += 1
                continue
            if "sync" in body:
                sock.send_multipart([frames[0], packb(count)])
                continue
            if "stop" in body:
                sock.send_multipart([frames[0], packb(True)])
                return
            sock.send_multipart([frames[0], packb(body)])
        else:
            meta = unpackb(frames[1].bytes)
            arr = np.frombuffer(frames[2].buffer, dtype=meta["dtype"]).reshape(meta["shape"])
            sock.send_multipart([frames[0], frames[1], arr], copy=False)


def _loop_server(endpoint: str, ready, cpus=None) -> None:
    """raw's ROUTER protocol (_raw_server), served from a uvloop event loop: ZMQ_FD in add_reader, drained without
    blocking -- the asynchronous floor's server."""
    _pin(cpus)
    allocator.keep_freed(MailboxConfig().malloc_keep_mib)
    import uvloop

    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(endpoint)
    unpackb, packb = msgpack.unpackb, msgpack.packb

    async def main():
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        count = 0

        def on_readable():
            # as a mailbox drains its socket: read without asking first (zmq.Again: nothing there), ask ZMQ_EVENTS
            # after the first message, read on until zmq.Again once there is a backlog
            nonlocal count
            n = 0
            while not done.done():
                if n == 1 and not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    return
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    return
                n += 1
                if len(frames) == 2:
                    body = unpackb(frames[1].bytes)
                    if "t" in body:
                        count += 1
                    elif "sync" in body:
                        sock.send_multipart([frames[0], packb(count)])
                    elif "stop" in body:
                        sock.send_multipart([frames[0], packb(True)])
                        done.set_result(None)
                    else:
                        sock.send_multipart([frames[0], packb(body)])
                else:
                    meta = unpackb(frames[1].bytes)
                    arr = np.frombuffer(frames[2].buffer, dtype=meta["dtype"]).reshape(meta["shape"])
                    sock.send_multipart([frames[0], frames[1], arr], copy=False)

        loop.add_reader(sock.getsockopt(zmq.FD), on_readable)
        ready.put(endpoint)
        loop.call_soon(on_readable)  # (a reply's send may consume the FD's edge: on_readable checks after it)
        await done
        loop.remove_reader(sock.getsockopt(zmq.FD))

    uvloop.run(main())


# ------------------------------------------------------------------------------------------------ variants
# Each variant's client runs in a process of its own (see Remote), so nothing one variant leaves behind -- threads,
# sockets on a shared ZMQ I/O thread, objects for the garbage collector -- slows down another.
class Raw:
    name = "raw pyzmq"

    def __init__(self, endpoint: str):
        allocator.keep_freed(MailboxConfig().malloc_keep_mib)
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.arr = _big_array()

    def rtt_us(self, n: int) -> float:
        send, recv, packb, unpackb = self.sock.send, self.sock.recv, msgpack.packb, msgpack.unpackb
        t0 = time.perf_counter()
        for i in range(n):
            send(packb({"x": i}))
            if unpackb(recv()) != {"x": i}:
                raise AssertionError("raw echo returned something else")
        return (time.perf_counter() - t0) / n * 1e6

    def pipelined(self, n: int) -> float:
        send, packb = self.sock.send, msgpack.packb
        self.sock.send(packb({"sync": 1}))
        start = msgpack.unpackb(self.sock.recv())
        t0 = time.perf_counter()
        for i in range(n):
            send(packb({"t": i}))
        self.sock.send(packb({"sync": 1}))
        end = msgpack.unpackb(self.sock.recv())
        dt = time.perf_counter() - t0
        if end - start != n:
            raise AssertionError(f"raw server counted {end - start} of {n} messages")
        return n / dt

    def big_ms(self, n: int) -> float:
        arr = self.arr
        meta = msgpack.packb({"dtype": arr.dtype.str, "shape": list(arr.shape)})
        t0 = time.perf_counter()
        for _ in range(n):
            self.sock.send_multipart([meta, arr], copy=False)
            frames = self.sock.recv_multipart(copy=False)
            m = msgpack.unpackb(frames[0].bytes)
            out = np.frombuffer(frames[1].buffer, dtype=m["dtype"]).reshape(m["shape"])
            _check_big(out, arr)
        return (time.perf_counter() - t0) / n * 1e3

    def close(self) -> None:
        self.sock.send(msgpack.packb({"stop": 1}))
        self.sock.recv()
        self.sock.close()


class _OnLoop:
    """A client whose figures are coroutines (_rtt, _pipelined, _big) run on its own event loop, `self.loop`."""

    def rtt_us(self, n: int) -> float:
        return self.loop.run_until_complete(self._rtt(n))

    def pipelined(self, n: int) -> float:
        return self.loop.run_until_complete(self._pipelined(n))

    def big_ms(self, n: int) -> float:
        return self.loop.run_until_complete(self._big(n))


def _recv_frames(sock) -> list:
    """One message's frames, without blocking, by Frame.more (recv_multipart asks ZMQ_RCVMORE after each frame,
    which raw's client, reading exactly the one frame it expects, does not)."""
    f = sock.recv(zmq.NOBLOCK, copy=False)
    frames = [f]
    while f.more:
        f = sock.recv(0, copy=False)
        frames.append(f)
    return frames


class Loop(_OnLoop):
    """raw's client messages from a uvloop event loop: each ask waits on a future that the reader callback resolves,
    each send is followed by one ZMQ_EVENTS check (a send can consume ZMQ_FD's edge), a wake-up reads without one --
    the least an asyncio mailbox does per message (slime's checks, no more), with no envelope, actor or tracing."""

    name = "uvloop floor"

    def __init__(self, endpoint: str):
        import uvloop

        allocator.keep_freed(MailboxConfig().malloc_keep_mib)
        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.arr = _big_array()
        self.waiter = None   # the future of the ask in flight
        self.writer = None   # a future for room in the queue
        self.loop.add_reader(self.sock.getsockopt(zmq.FD), self._on_fd)

    def _on_fd(self) -> None:
        """The FD woke: read the reply without asking ZMQ_EVENTS first, and leave the next check to the send that
        the woken ask makes next (as a mailbox does); waiting for room, check the socket's events instead."""
        if self.writer is not None and not self.writer.done():
            self._check()
            return
        try:
            frames = _recv_frames(self.sock)
        except zmq.Again:
            return
        self._answer(frames)

    def _check(self) -> None:
        """After a send (it may have consumed the FD's edge) or while waiting for room: ask ZMQ_EVENTS."""
        sock = self.sock
        while True:
            events = sock.getsockopt(zmq.EVENTS)
            if events & zmq.POLLOUT and self.writer is not None and not self.writer.done():
                self.writer.set_result(None)
            if not events & zmq.POLLIN:
                return
            self._answer(_recv_frames(sock))

    def _answer(self, frames) -> None:
        w, self.waiter = self.waiter, None
        if w is None or w.done():
            raise AssertionError("loop client: a reply nobody asked for")
        w.set_result(frames)

    def _ask(self, parts, copy=True):
        self.waiter = fut = self.loop.create_future()
        self.sock.send_multipart(parts, copy=copy)
        self.loop.call_soon(self._check)
        return fut

    async def _rtt(self, n: int) -> float:
        packb, unpackb = msgpack.packb, msgpack.unpackb
        t0 = time.perf_counter()
        for i in range(n):
            frames = await self._ask([packb({"x": i})])
            if unpackb(frames[0].bytes) != {"x": i}:
                raise AssertionError("loop echo returned something else")
        return (time.perf_counter() - t0) / n * 1e6

    async def _pipelined(self, n: int) -> float:
        send, packb = self.sock.send, msgpack.packb
        start = msgpack.unpackb((await self._ask([packb({"sync": 1})]))[0].bytes)
        t0 = time.perf_counter()
        for i in range(n):
            while True:
                try:
                    send(packb({"t": i}), zmq.NOBLOCK)
                    break
                except zmq.Again:  # the queue is full: wait for room (polled too: the FD is edge-triggered)
                    self.writer = self.loop.create_future()
                    self.loop.call_soon(self._check)
                    try:
                        await asyncio.wait_for(self.writer, 0.05)
                    except asyncio.TimeoutError:
                        pass
        end = msgpack.unpackb((await self._ask([packb({"sync": 1})]))[0].bytes)
        dt = time.perf_counter() - t0
        if end - start != n:
            raise AssertionError(f"loop server counted {end - start} of {n} messages")
        return n / dt

    async def _big(self, n: int) -> float:
        arr = self.arr
        meta = msgpack.packb({"dtype": arr.dtype.str, "shape": list(arr.shape)})
        t0 = time.perf_counter()
        for _ in range(n):
            frames = await self._ask([meta, arr], copy=False)
            m = msgpack.unpackb(frames[0].bytes)
            _check_big(np.frombuffer(frames[1].buffer, dtype=m["dtype"]).reshape(m["shape"]), arr)
        return (time.perf_counter() - t0) / n * 1e3

    def close(self) -> None:
        self.loop.run_until_complete(self._ask([msgpack.packb({"stop": 1})]))
        self.loop.remove_reader(self.sock.getsockopt(zmq.FD))
        self.sock.close()
        self.loop.close()


class Slime(_OnLoop):
    """A client actor on its own uvloop loop, run for the length of each command.

    Each timed run ends when both sides' traces hold all it sent and received: the writer threads' work (packing
    leftovers, array checksums) is part of what tracing costs -- and is not left to slow down the next variant."""

    def __init__(self, index: int, trace: bool, endpoint: str, run_dir: str):
        import uvloop

        from slime_actors.log import setup_logging
        setup_logging(run_dir, f"client/{index}", console=False, level="warning")
        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.client = BenchClient(index)
        self.peer = f"bench/{index}"
        self.loop.run_until_complete(self.client.start(RuntimeConfig(run_dir=run_dir, curve=False, trace=trace,
                                                                     static_peers={self.peer: endpoint})))
        self.arr = _big_array()

    async def _flushed(self) -> None:
        if self.client.tracer is not None:
            self.client.tracer.flush()
        await self.client.ask(self.peer, "flush")

    async def _rtt(self, n: int) -> float:
        ask, peer = self.client.ask, self.peer
        t0 = time.perf_counter()
        for i in range(n):
            if await ask(peer, "echo", {"x": {"x": i}}) != {"x": i}:
                raise AssertionError("slime echo returned something else")
        await self._flushed()
        return (time.perf_counter() - t0) / n * 1e6

    async def _pipelined(self, n: int) -> float:
        tell, peer = self.client.tell, self.peer
        start = await self.client.ask(peer, "count")
        await self._flushed()
        t0 = time.perf_counter()
        for i in range(n):
            await tell(peer, "sink", {"x": i})
        end = await self.client.ask(peer, "count")  # answered after every tell before it (per-sender FIFO)
        await self._flushed()
        dt = time.perf_counter() - t0
        if end - start != n:
            raise AssertionError(f"slime server counted {end - start} of {n} messages")
        return n / dt

    async def _big(self, n: int) -> float:
        arr = self.arr
        t0 = time.perf_counter()
        for _ in range(n):
            out = await self.client.ask(self.peer, "echo", {"x": arr})
            _check_big(out, arr)
        await self._flushed()
        return (time.perf_counter() - t0) / n * 1e3

    def close(self) -> None:
        async def stop():
            await self.client.ask(self.peer, "_stop", timeout=5)
            await self.client.stop()
        self.loop.run_until_complete(stop())
        self.loop.close()


class RayClient:
    """ray.get on a Ray actor's methods, from this (driver) process."""

    name = "Ray"

    def __init__(self, server_cpus=None):
        import ray
        self.ray = ray
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)

        @ray.remote
        class Echo:
            def __init__(self, cpus):
                self.received = 0
                if cpus:  # the actor's worker process, where the other variants' servers run (inline: Ray's
                    import os  # workers cannot import this script's functions)
                    os.sched_setaffinity(0, cpus)

            def echo(self, x):
                return x

            def sink(self, x):
                self.received += 1

        self.actor = Echo.remote(server_cpus)
        ray.get(self.actor.echo.remote(0))
        self.arr = _big_array()

    def rtt_us(self, n: int) -> float:
        get, echo = self.ray.get, self.actor.echo
        t0 = time.perf_counter()
        for i in range(n):
            if get(echo.remote({"x": i})) != {"x": i}:
                raise AssertionError("ray echo returned something else")
        return (time.perf_counter() - t0) / n * 1e6

    def pipelined(self, n: int) -> float:
        sink = self.actor.sink
        t0 = time.perf_counter()
        self.ray.get([sink.remote(i) for i in range(n)])
        return n / (time.perf_counter() - t0)

    def big_ms(self, n: int) -> float:
        arr = self.arr
        t0 = time.perf_counter()
        for _ in range(n):
            _check_big(self.ray.get(self.actor.echo.remote(arr)), arr)
        return (time.perf_counter() - t0) / n * 1e3

    def close(self) -> None:
        self.ray.shutdown()


_CLIENTS = {"raw": Raw, "loop": Loop, "slime": Slime, "ray": RayClient}


def _client_main(kind: str, args: tuple, conn, cpus=None) -> None:
    _pin(cpus)
    try:
        client = _CLIENTS[kind](*args)
    except Exception as exc:  # noqa: BLE001 -- reported to the driver, which names it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        cmd, arg = conn.recv()
        try:
            value = client.close() if cmd == "close" else getattr(client, cmd)(arg)
        except Exception as exc:  # noqa: BLE001
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        else:
            conn.send(("ok", value))
        if cmd == "close":
            return


class Remote:
    """A variant's client in a process of its own, asked for each figure in turn over a pipe."""

    def __init__(self, ctx, kind: str, *args, cpus=None, start_timeout: float = 180):
        self.kind = kind
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_client_main, args=(kind, args, child, cpus), daemon=True)
        self.proc.start()
        if not self.conn.poll(start_timeout):
            self.proc.kill()
            raise RuntimeError(f"the {kind} client process did not start within {start_timeout:.0f} s")
        status, msg = self.conn.recv()
        if status != "ready":
            self.proc.join(timeout=5)
            raise RuntimeError(f"the {kind} client process failed to start: {msg}")

    def _call(self, cmd: str, arg=None):
        self.conn.send((cmd, arg))
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"{self.kind} {cmd} failed: {value}")
        return value

    def rtt_us(self, n: int) -> float:
        return self._call("rtt_us", n)

    def pipelined(self, n: int) -> float:
        return self._call("pipelined", n)

    def big_ms(self, n: int) -> float:
        return self._call("big_ms", n)

    def close(self) -> None:
        try:
            self._call("close")
        finally:
            self.proc.join(timeout=30)
            if self.proc.is_alive():
                self.proc.kill()


def _big_array() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(BIG_SHAPE).astype(np.float32)


def _check_big(out, arr) -> None:
    if out.shape != arr.shape or out[0] != arr[0] or out[-1] != arr[-1] or out[len(out) // 2] != arr[len(arr) // 2]:
        raise AssertionError("16 MiB echo came back different")


# ------------------------------------------------------------------------------------------------ driver
def run(args) -> dict:
    ctx = mp.get_context("spawn")
    # run directories (sockets, trace files) in memory where there is a tmpfs: the page cache's writeback of one
    # variant's trace files would otherwise land, seconds later, on whichever variant runs then
    shm = "/dev/shm" if args.run_dir is None and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    tmp = tempfile.mkdtemp(prefix="slime-bench-", dir=args.run_dir or shm)
    procs = []
    variants: dict[str, Remote] = {}
    try:
        q = ctx.Queue()
        wanted = set(args.variants)
        # --pin: every client process on one CPU, every server process on another -- the same placement for each
        # variant, so the scheduler's choices (both ends on one core or not) do not move the figures run to run
        client_cpus, server_cpus = ({args.pin[0]}, {args.pin[1]}) if args.pin else (None, None)
        if "raw" in wanted:
            raw_ep = f"ipc://{tmp}/raw.sock"
            p = ctx.Process(target=_raw_server, args=(raw_ep, q, server_cpus), daemon=True)
            p.start()
            procs.append(p)
            q.get(timeout=60)
            variants["raw"] = Remote(ctx, "raw", raw_ep, cpus=client_cpus)
        if "loop" in wanted:
            loop_ep = f"ipc://{tmp}/loop.sock"
            p = ctx.Process(target=_loop_server, args=(loop_ep, q, server_cpus), daemon=True)
            p.start()
            procs.append(p)
            q.get(timeout=60)
            variants["loop"] = Remote(ctx, "loop", loop_ep, cpus=client_cpus)
        for index, trace in ((0, True), (1, False)):
            if ("on" if trace else "off") not in wanted:
                continue
            run_dir = os.path.join(tmp, f"run{index}")
            p = ctx.Process(target=_slime_server, args=(run_dir, index, trace, q, server_cpus), daemon=True)
            p.start()
            procs.append(p)
            endpoint = q.get(timeout=60)
            variants["on" if trace else "off"] = Remote(ctx, "slime", index, trace, endpoint, run_dir,
                                                        cpus=client_cpus)

        # warm-up: connections, imports, caches
        for v in variants.values():
            v.rtt_us(300)
            v.big_ms(1)
            v.pipelined(2000)

        samples: dict[tuple[str, str], list[float]] = {}

        def rounds(keys: list[str]) -> None:
            for r in range(args.rounds):
                order = keys[r % len(keys):] + keys[:r % len(keys)]  # rotate, so no variant always goes first
                for key in order:
                    v = variants[key]
                    is_ray = key == "ray"
                    samples.setdefault((key, "rtt"), []).append(v.rtt_us(args.ray_asks if is_ray else args.asks))
                    samples.setdefault((key, "pipe"), []).append(
                        v.pipelined(args.ray_calls if is_ray else args.tells))
                    samples.setdefault((key, "big"), []).append(v.big_ms(args.ray_big if is_ray else args.big))
                print(f"  round {r + 1}/{args.rounds} done ({', '.join(keys)})", file=sys.stderr, flush=True)

        rounds(list(variants))

        # Ray last, on its own: its daemons (GCS, raylet, the actor's worker, the driver's threads) keep running
        # while Ray is up and would slow down whatever else is measured meanwhile -- a cost of Ray, not of the others.
        ray_note = None
        if args.no_ray:
            ray_note = "Ray skipped (--no-ray)"
        elif importlib.util.find_spec("ray") is None:
            ray_note = "Ray not installed; install the bench extra: pip install -e '.[bench]'"
        else:
            try:
                variants["ray"] = v = Remote(ctx, "ray", server_cpus, cpus=client_cpus)
            except RuntimeError as exc:  # Ray installed but not starting here: the other columns still stand
                ray_note = f"Ray did not start, its column is empty: {str(exc)[:300]}"
            else:
                v.rtt_us(20)
                v.big_ms(1)
                v.pipelined(200)
                rounds(["ray"])
        return {"samples": samples, "ray_note": ray_note, "where": os.path.dirname(tmp)}
    finally:
        for v in variants.values():
            try:
                v.close()
            except Exception as exc:  # noqa: BLE001 -- a failed close must not hide the bench's own error
                print(f"  closing the {v.kind} client: {exc}", file=sys.stderr)
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _med(samples, key, fig):
    vals = samples.get((key, fig))
    return statistics.median(vals) if vals else None


COLUMNS = ("raw", "loop", "on", "off", "ray")
INTERLEAVED = {"raw", "loop", "on", "off"}  # measured round by round, side by side (Ray runs after them)


def ratios(samples: dict, num: tuple, den: tuple) -> list[float]:
    """num/den per round, for two figures measured in the same rounds; else the one ratio of their medians."""
    a, b = samples.get(num), samples.get(den)
    if not a or not b:
        return []
    if {num[0], den[0]} <= INTERLEAVED and len(a) == len(b):
        return [x / y for x, y in zip(a, b)]
    return [statistics.median(a) / statistics.median(b)]


def verdict(rs: list[float], target: float, op: str) -> str:
    """PASS: every round met the target; BORDERLINE: the median did, not every round; MISS: the median did not."""
    if not rs:
        return "SKIP"
    def ok(r):
        return r <= target if op == "≤" else r >= target
    if not ok(statistics.median(rs)):
        return "MISS"
    met = sum(map(ok, rs))
    return "PASS" if met == len(rs) else f"BORDERLINE ({met}/{len(rs)} rounds)"


def render(result: dict, args, started: str, load: tuple) -> str:
    s = result["samples"]
    med = {(k, f): _med(s, k, f) for k in COLUMNS for f in ("rtt", "pipe", "big")}
    mib = BIG_SHAPE[0] * 4 / 2**20

    def gbps(ms):  # payload moved per second, both directions
        return None if ms is None else 2 * mib / 1024 / (ms / 1e3)

    def cell(v, fmt):
        return "—" if v is None else fmt.format(v)

    def figure_row(what, fig, fmt, f=lambda v: v):
        return f"| {what} | " + " | ".join(cell(f(med[(k, fig)]), fmt) for k in COLUMNS) + " | | | |"

    def ratio_row(what, num, den, target=None, op=None):
        """A ratio (median of per-round ratios, their range) and its verdict; target None: shown, not judged."""
        rs = ratios(s, num, den)
        empty = "| " * len(COLUMNS)
        goal = "—" if target is None else f"{op} {target:g}x"
        if not rs:
            return f"| {what} {empty}| n/a | {goal} | {'' if target is None else 'SKIP'} |"
        r = statistics.median(rs)
        spread = f" ({min(rs):.2f}–{max(rs):.2f})" if len(rs) > 1 else ""
        judged = "" if target is None else verdict(rs, target, op)
        return f"| {what} {empty}| {r:.2f}x{spread} | {goal} | {judged} |"

    rows = [
        "| figure (median of rounds) | raw pyzmq | uvloop floor | slime trace on | slime trace off | Ray | ratio "
        "(per-round range) | target | |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        figure_row("ask round trip, small body (µs)", "rtt", "{:.0f}"),
        figure_row("pipelined one-way msgs/s", "pipe", "{:,.0f}"),
        figure_row(f"{mib:.0f} MiB array round trip (ms)", "big", "{:.1f}"),
        figure_row(f"{mib:.0f} MiB round trip throughput (GiB/s, both ways)", "big", "{:.2f}", gbps),
        ratio_row("ask RTT: slime (trace on) / raw", ("on", "rtt"), ("raw", "rtt"), 1.3, "≤"),
        ratio_row("ask RTT: slime (trace off) / raw", ("off", "rtt"), ("raw", "rtt"), 1.3, "≤"),
        ratio_row("ask RTT: uvloop floor / raw (the event loop's share)", ("loop", "rtt"), ("raw", "rtt")),
        ratio_row("ask RTT: slime (trace on) / uvloop floor (slime's own share)", ("on", "rtt"), ("loop", "rtt")),
        ratio_row("ask RTT: Ray / slime (trace on)", ("ray", "rtt"), ("on", "rtt"), 7, "≥"),
        ratio_row("pipelined: slime (trace on) / Ray async calls", ("on", "pipe"), ("ray", "pipe"), 15, "≥"),
        ratio_row(f"{mib:.0f} MiB throughput: slime (trace on) / raw", ("raw", "big"), ("on", "big"), 0.9, "≥"),
        ratio_row(f"{mib:.0f} MiB throughput: slime (trace off) / raw", ("raw", "big"), ("off", "big"), 0.9, "≥"),
        ratio_row("tracing: throughput on / off (cost ≤ 10%)", ("on", "pipe"), ("off", "pipe"), 0.9, "≥"),
    ]
    head = [
        f"command: {' '.join([os.path.relpath(sys.executable)] + sys.argv)}",
        f"date: {started}; host: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        f"python {platform.python_version()}, pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()}), "
        f"msgpack {'.'.join(map(str, msgpack.version))}, numpy {np.__version__}",
        f"rounds: {args.rounds} (interleaved, rotating order); per round: {args.asks} asks, {args.tells} tells, "
        f"{args.big} big round trips (Ray: {args.ray_asks}, {args.ray_calls}, {args.ray_big}); "
        f"load average before/after: {load[0]:.2f} / {load[1]:.2f}; run directories in {result['where']}; "
        + (f"clients pinned to CPU {args.pin[0]}, servers (Ray: its actor's worker) to CPU {args.pin[1]}, Ray's "
              "daemons unpinned" if args.pin
           else "not pinned"),
    ]
    out = "\n".join(head) + "\n\n" + "\n".join(rows)
    if result["ray_note"]:
        out += f"\n\nnote: {result['ray_note']}"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--asks", type=int, default=2000, help="sequential asks per round")
    ap.add_argument("--tells", type=int, default=20000, help="pipelined tells per round")
    ap.add_argument("--big", type=int, default=10, help="16 MiB round trips per round")
    ap.add_argument("--ray-asks", type=int, default=300)
    ap.add_argument("--ray-calls", type=int, default=2000)
    ap.add_argument("--ray-big", type=int, default=5)
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray column")
    ap.add_argument("--variants", default="raw,loop,on,off", help="which of raw, loop, on, off to measure (default: "
                    "all four; Ray is measured unless --no-ray)")
    ap.add_argument("--pin", default="auto", help="CPUs for the client and the server processes, as C,S (default "
                    "auto: the first two this process may use, when there are at least two; 'none' to let the "
                    "scheduler place them)")
    ap.add_argument("--run-dir", default=None, help="where the runs' sockets and trace files go (default: a new "
                    "directory in /dev/shm where it exists, else in the system's temporary directory)")
    ap.add_argument("--quick", action="store_true", help="a short run (3 rounds, fewer messages) for smoke tests")
    args = ap.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    allowed = sorted(os.sched_getaffinity(0))
    if args.pin == "auto":
        args.pin = allowed[:2] if len(allowed) >= 2 else None
    elif args.pin == "none":
        args.pin = None
    else:
        try:
            args.pin = [int(c) for c in args.pin.split(",")]
        except ValueError:
            args.pin = []
        if len(args.pin) != 2 or not set(args.pin) <= set(allowed):
            ap.error(f"--pin takes two of the CPUs this process may use ({allowed}) as C,S, or auto, or none")
    unknown = sorted(set(args.variants) - INTERLEAVED)
    if unknown or not args.variants:
        ap.error(f"--variants takes raw, loop, on, off (comma-separated), got {args.variants!r}")
    if args.quick:
        args.rounds, args.asks, args.tells, args.big = 3, 300, 3000, 3
        args.ray_asks, args.ray_calls, args.ray_big = 50, 300, 2
    from slime_actors.log import setup_logging
    setup_logging(None, "bench", console=False, level="warning")
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    load0 = os.getloadavg()[0]
    result = run(args)
    print(render(result, args, started, (load0, os.getloadavg()[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
