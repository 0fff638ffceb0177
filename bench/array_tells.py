"""Streams of arrays sent with tells, and with asks, between two processes: what sending an array safely costs.

    .venv/bin/python bench/array_tells.py

A tell of an array of 64 KiB or more returns once ZeroMQ has written it out (the caller may then change it:
docs/wire-format.md, "Arrays are sent from your memory"), so back-to-back tells of large arrays do not queue up in
the sender. This measures, for a few array sizes, a stream of tells (ended by an ask the receiver answers after all
of them: per-sender FIFO) and a stream of sequential asks whose replies are small, both untraced: arrays per second
and GiB/s. Each size runs --rounds times, tells and asks alternating; the table shows the median.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from slime_actors.actors.base import Actor, handler
from slime_actors.runtime import RuntimeConfig


class Sink(Actor):
    role = "sink"

    def __init__(self, index=0, **config):
        super().__init__(index, **config)
        self.received = 0

    @handler
    def put(self, x=None) -> None:
        self.received += 1

    @handler
    def take(self, x=None) -> int:
        self.received += 1
        return self.received

    @handler
    def count(self) -> int:
        return self.received


class Source(Actor):
    role = "source"


def _serve(run_dir: str, ready) -> None:
    import uvloop

    from slime_actors.log import setup_logging
    setup_logging(run_dir, "sink/0", console=False, level="warning")

    async def main():
        sink = Sink(0)
        await sink.start(RuntimeConfig(run_dir=run_dir, curve=False, trace=False))
        ready.put(sink.endpoint)
        await sink.wait_stopped()

    uvloop.run(main())


async def _stream(src: Source, arr: np.ndarray, n: int, tells: bool) -> float:
    start = await src.ask("sink/0", "count")
    t0 = time.perf_counter()
    for _ in range(n):
        if tells:
            await src.tell("sink/0", "put", {"x": arr})
        else:
            await src.ask("sink/0", "take", {"x": arr})
    end = await src.ask("sink/0", "count")
    dt = time.perf_counter() - t0
    if end - start != n:
        raise AssertionError(f"the sink counted {end - start} of {n} arrays")
    return n / dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="65536,1048576,16777216", help="array sizes in bytes, comma-separated")
    ap.add_argument("--bytes", type=int, default=256 << 20, help="bytes sent per stream (default 256 MiB)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--sizes takes byte counts, comma-separated, got {args.sizes!r}")
    if not sizes or min(sizes) < 4 or args.rounds < 1 or args.bytes < 1:
        ap.error("--sizes must be >= 4 bytes each, --rounds and --bytes >= 1")
    import uvloop

    from slime_actors.log import setup_logging
    run_dir = tempfile.mkdtemp(prefix="slime-array-tells-",
                               dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    setup_logging(run_dir, "bench", console=False, level="warning")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_serve, args=(run_dir, q), daemon=True)
    proc.start()
    endpoint = q.get(timeout=60)

    async def measure():
        src = Source(0)
        await src.start(RuntimeConfig(run_dir=run_dir, curve=False, trace=False,
                                      static_peers={"sink/0": endpoint}))
        rows = []
        try:
            for size in sizes:
                arr = np.ones(size // 4, np.float32)
                n = max(1, args.bytes // size)
                await _stream(src, arr, min(n, 3), True)  # warm-up
                got = {True: [], False: []}
                for _ in range(args.rounds):
                    for tells in (True, False):
                        got[tells].append(await _stream(src, arr, n, tells))
                rows.append((size, n, statistics.median(got[True]), statistics.median(got[False])))
            await src.ask("sink/0", "_stop", timeout=5)
        finally:
            await src.stop()
        return rows

    rows = uvloop.run(measure())
    proc.join(timeout=10)
    print(f"command: {' '.join([os.path.relpath(sys.executable)] + sys.argv)}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}; {os.cpu_count()} CPUs; untraced; median of {args.rounds}\n")
    print("| array | per stream | tells: arrays/s | tells: GiB/s | asks: arrays/s | asks: GiB/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size, n, tell_rate, ask_rate in rows:
        print(f"| {size / 1024:,.0f} KiB | {n} | {tell_rate:,.0f} | {tell_rate * size / 2**30:.2f} | "
              f"{ask_rate:,.0f} | {ask_rate * size / 2**30:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
