"""Mailbox benchmark (issue 2): slime-actors against raw pyzmq+msgpack (the floor) and Ray, in one run.

    .venv/bin/python bench/mailbox.py            (or `make bench`; --quick for a short run, --no-ray to skip Ray)

Every variant is two processes on this machine -- this driver and one server process:

    raw        a blocking pyzmq DEALER here, a blocking ROUTER loop there; bodies msgpack, arrays as zero-copy frames
    slime      a client actor here, an echo actor there (ipc://, CURVE off), tracing on (the default) or off
    Ray        ray.get on an actor's method, from a driver process of its own (Ray's own daemons run too: that is what
               a Ray actor call costs; its driver threads are kept out of the process the other clients run in)

Figures: ask round trip of a small body (sequential), pipelined one-way messages per second (tells sent back to
back, then one ask that is answered after all of them: per-sender FIFO), and the round trip of a 16 MiB float32 numpy
array. raw and slime are interleaved -- each round runs every variant once, in a rotating order -- and the table shows
the median over rounds, so a burst of noise from other work on the machine hits all of them alike. Ray's rounds run
after those, while its daemons are up (they take CPU from whatever runs beside them).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
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


class BenchClient(Actor):
    role = "client"


def _slime_server(run_dir: str, index: int, trace: bool, ready) -> None:
    import uvloop

    from slime_actors.log import setup_logging
    setup_logging(run_dir, f"bench/{index}", console=False, level="warning")

    async def main():
        actor = BenchEcho(index)
        await actor.start(RuntimeConfig(run_dir=run_dir, curve=False, trace=trace))
        ready.put(actor.endpoint)
        await actor.wait_stopped()

    uvloop.run(main())


def _raw_server(endpoint: str, ready) -> None:
    """Blocking ROUTER: [id, body] -> echo (or count a {'t': ...} tell, or answer {'sync': 1} with the count);
    [id, meta, data] -> the array echoed back zero-copy, after viewing it as a numpy array."""
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


# ------------------------------------------------------------------------------------------------ variants
class Raw:
    name = "raw pyzmq"

    def __init__(self, endpoint: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)

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

    def big_ms(self, arr: np.ndarray, n: int) -> float:
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


class Slime:
    def __init__(self, client: BenchClient, peer: str, trace: bool):
        self.client, self.peer = client, peer
        self.name = f"slime trace {'on' if trace else 'off'}"

    async def rtt_us(self, n: int) -> float:
        ask, peer = self.client.ask, self.peer
        t0 = time.perf_counter()
        for i in range(n):
            if await ask(peer, "echo", {"x": {"x": i}}) != {"x": i}:
                raise AssertionError("slime echo returned something else")
        return (time.perf_counter() - t0) / n * 1e6

    async def pipelined(self, n: int) -> float:
        tell, peer = self.client.tell, self.peer
        start = await self.client.ask(peer, "count")
        t0 = time.perf_counter()
        for i in range(n):
            await tell(peer, "sink", {"x": i})
        end = await self.client.ask(peer, "count")  # answered after every tell before it (per-sender FIFO)
        dt = time.perf_counter() - t0
        if end - start != n:
            raise AssertionError(f"slime server counted {end - start} of {n} messages")
        return n / dt

    async def big_ms(self, arr: np.ndarray, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            out = await self.client.ask(self.peer, "echo", {"x": arr})
            _check_big(out, arr)
        return (time.perf_counter() - t0) / n * 1e3


class _RayDriver:
    """Runs in a process of its own (see RayVariant): Ray's driver threads would otherwise share the process, and the
    cores, with the raw and slime clients while those are measured."""

    def __init__(self):
        import ray
        self.ray = ray
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)

        @ray.remote
        class Echo:
            def __init__(self):
                self.received = 0

            def echo(self, x):
                return x

            def sink(self, x):
                self.received += 1

        self.actor = Echo.remote()
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


def _ray_driver(conn) -> None:
    try:
        driver = _RayDriver()
    except Exception as exc:  # noqa: BLE001 -- reported to the bench, which prints it in its note
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        cmd, arg = conn.recv()
        if cmd == "close":
            driver.ray.shutdown()
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", getattr(driver, cmd)(arg)))
        except Exception as exc:  # noqa: BLE001
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class RayVariant:
    """Ray actor calls, made from a driver process of Ray's own (`_RayDriver`), asked for each figure in turn."""

    name = "Ray"

    def __init__(self, ctx):
        import importlib.util
        if importlib.util.find_spec("ray") is None:
            raise ImportError("No module named 'ray'")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_ray_driver, args=(child,), daemon=True)
        self.proc.start()
        if not self.conn.poll(180):
            self.proc.kill()
            raise RuntimeError("the Ray driver process did not start within 180 s")
        status, msg = self.conn.recv()
        if status != "ready":
            raise RuntimeError(f"the Ray driver process failed to start: {msg}")

    def _call(self, cmd: str, arg):
        self.conn.send((cmd, arg))
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"Ray {cmd} failed: {value}")
        return value

    def rtt_us(self, n: int) -> float:
        return self._call("rtt_us", n)

    def pipelined(self, n: int) -> float:
        return self._call("pipelined", n)

    def big_ms(self, arr: np.ndarray, n: int) -> float:
        return self._call("big_ms", n)  # the driver made the same array (_big_array)

    def close(self) -> None:
        try:
            self._call("close", None)
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
async def _maybe(x):
    return await x if asyncio.iscoroutine(x) else x


async def run(args) -> dict:
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="slime-bench-")
    procs = []
    try:
        q = ctx.Queue()
        raw_ep = f"ipc://{tmp}/raw.sock"
        p = ctx.Process(target=_raw_server, args=(raw_ep, q), daemon=True)
        p.start()
        procs.append(p)
        q.get(timeout=60)
        raw = Raw(raw_ep)

        variants = {"raw": raw}
        for index, trace in ((0, True), (1, False)):
            run_dir = os.path.join(tmp, f"run{index}")
            p = ctx.Process(target=_slime_server, args=(run_dir, index, trace, q), daemon=True)
            p.start()
            procs.append(p)
            endpoint = q.get(timeout=60)
            c = BenchClient(index)
            await c.start(RuntimeConfig(run_dir=run_dir, curve=False, trace=trace,
                                        static_peers={f"bench/{index}": endpoint}))
            variants["on" if trace else "off"] = Slime(c, f"bench/{index}", trace)

        arr = _big_array()
        # warm-up: connections, imports, caches
        for v in variants.values():
            await _maybe(v.rtt_us(300))
            await _maybe(v.big_ms(arr, 1))
            await _maybe(v.pipelined(2000))

        samples: dict[tuple[str, str], list[float]] = {}

        async def rounds(keys: list[str]) -> None:
            for r in range(args.rounds):
                order = keys[r % len(keys):] + keys[:r % len(keys)]  # rotate, so no variant always goes first
                for key in order:
                    v = variants[key]
                    is_ray = key == "ray"
                    samples.setdefault((key, "rtt"), []).append(
                        await _maybe(v.rtt_us(args.ray_asks if is_ray else args.asks)))
                    samples.setdefault((key, "pipe"), []).append(
                        await _maybe(v.pipelined(args.ray_calls if is_ray else args.tells)))
                    samples.setdefault((key, "big"), []).append(
                        await _maybe(v.big_ms(arr, args.ray_big if is_ray else args.big)))
                print(f"  round {r + 1}/{args.rounds} done ({', '.join(keys)})", file=sys.stderr, flush=True)

        await rounds(list(variants))

        # Ray last, on its own: its daemons (GCS, raylet, the actor's worker, the driver's threads) keep running
        # while Ray is up and would slow down whatever else is measured meanwhile -- a cost of Ray, not of the others.
        ray_note = None
        if args.no_ray:
            ray_note = "Ray skipped (--no-ray)"
        else:
            try:
                variants["ray"] = RayVariant(ctx)
            except ImportError as exc:
                ray_note = f"Ray not importable ({exc}); install the bench extra: pip install -e '.[bench]'"
            else:
                v = variants["ray"]
                v.rtt_us(20)
                v.big_ms(arr, 1)
                v.pipelined(200)
                await rounds(["ray"])

        raw.close()
        for key in ("on", "off"):
            await variants[key].client.ask(variants[key].peer, "_stop", timeout=5)
            await variants[key].client.stop()
        if "ray" in variants:
            variants["ray"].close()
        return {"samples": samples, "ray_note": ray_note}
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _med(samples, key, fig):
    vals = samples.get((key, fig))
    return statistics.median(vals) if vals else None


def render(result: dict, args, started: str, load: tuple) -> str:
    s = result["samples"]
    med = {(k, f): _med(s, k, f) for k in ("raw", "on", "off", "ray") for f in ("rtt", "pipe", "big")}
    mib = BIG_SHAPE[0] * 4 / 2**20

    def gbps(ms):  # payload moved per second, both directions
        return None if ms is None else 2 * mib / 1024 / (ms / 1e3)

    def cell(v, fmt):
        return "—" if v is None else fmt.format(v)

    def ratio_row(what, num, den, target, op):
        if num is None or den is None:
            return f"| {what} | | | | | n/a | {op} {target:g} | SKIP |"
        r = num / den
        ok = r <= target if op == "≤" else r >= target
        return f"| {what} | | | | | {r:.2f}x | {op} {target:g}x | {'PASS' if ok else 'MISS'} |"

    rows = [
        "| figure (median of rounds) | raw pyzmq | slime trace on | slime trace off | Ray | ratio | target | |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
        "| ask round trip, small body (µs) | " + " | ".join(cell(med[(k, "rtt")], "{:.0f}") for k in
                                                  ("raw", "on", "off", "ray")) + " | | | |",
        "| pipelined one-way msgs/s | " + " | ".join(cell(med[(k, "pipe")], "{:,.0f}") for k in
                                                  ("raw", "on", "off", "ray")) + " | | | |",
        f"| {mib:.0f} MiB array round trip (ms) | " + " | ".join(cell(med[(k, "big")], "{:.1f}") for k in
                                                            ("raw", "on", "off", "ray")) + " | | | |",
        f"| {mib:.0f} MiB round trip throughput (GiB/s, both ways) | " + " | ".join(
            cell(gbps(med[(k, "big")]), "{:.2f}") for k in ("raw", "on", "off", "ray")) + " | | | |",
        ratio_row("ask RTT: slime (trace on) / raw", med[("on", "rtt")], med[("raw", "rtt")], 1.3, "≤"),
        ratio_row("ask RTT: slime (trace off) / raw", med[("off", "rtt")], med[("raw", "rtt")], 1.3, "≤"),
        ratio_row("ask RTT: Ray / slime (trace on)", med[("ray", "rtt")], med[("on", "rtt")], 7, "≥"),
        ratio_row("pipelined: slime (trace on) / Ray async calls", med[("on", "pipe")], med[("ray", "pipe")], 15,
                  "≥"),
        ratio_row(f"{mib:.0f} MiB throughput: slime (trace on) / raw", med[("raw", "big")], med[("on", "big")], 0.9,
                  "≥"),
        ratio_row(f"{mib:.0f} MiB throughput: slime (trace off) / raw", med[("raw", "big")], med[("off", "big")],
                  0.9, "≥"),
        ratio_row("tracing: throughput on / off (cost ≤ 10%)", med[("on", "pipe")], med[("off", "pipe")], 0.9, "≥"),
    ]
    head = [
        f"command: {' '.join([os.path.relpath(sys.executable)] + sys.argv)}",
        f"date: {started}; host: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        f"python {platform.python_version()}, pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()}), "
        f"msgpack {'.'.join(map(str, msgpack.version))}, numpy {np.__version__}",
        f"rounds: {args.rounds} (interleaved, rotating order); per round: {args.asks} asks, {args.tells} tells, "
        f"{args.big} big round trips (Ray: {args.ray_asks}, {args.ray_calls}, {args.ray_big}); "
        f"load average before/after: {load[0]:.2f} / {load[1]:.2f}",
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
    ap.add_argument("--quick", action="store_true", help="a short run (3 rounds, fewer messages) for smoke tests")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.asks, args.tells, args.big = 3, 300, 3000, 3
        args.ray_asks, args.ray_calls, args.ray_big = 50, 300, 2
    import uvloop

    from slime_actors.log import setup_logging
    setup_logging(None, "bench", console=False, level="warning")
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    load0 = os.getloadavg()[0]
    result = uvloop.run(run(args))
    print(render(result, args, started, (load0, os.getloadavg()[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
