"""What tracing costs the receiver of a tell, per message, in-process (issue 2's "tracing costs <= 10 %").

    .venv/bin/python bench/trace_cost.py

The receiver is what limits bench/mailbox.py's pipelined figure (its CPU is at 100 %, the sender's at ~55 %), and
its per-message Python is what tracing adds to. This drives an echo actor's ROUTER callback (`Mailbox._on_router`:
header decode, dispatch, the `sink` handler, the trace record) with prebuilt frames, traced and untraced, in
alternating rounds, and prints the best round of each: no sockets, no second process, so the difference is the
tracing work itself (the writer thread's share is left out: it drains between rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

import msgpack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mailbox import BenchEcho  # noqa: E402  (bench/mailbox.py)

from slime_actors.mailbox import codec  # noqa: E402
from slime_actors.runtime import RuntimeConfig  # noqa: E402


async def _per_tell_us(trace: bool, n: int, rounds: int) -> float:
    run_dir = tempfile.mkdtemp(prefix="slime-trace-cost-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    actor = BenchEcho(0)
    await actor.start(RuntimeConfig(run_dir=run_dir, curve=False, trace=trace))
    try:
        frames = [[b"client/0#1#000000",
                   msgpack.packb(codec.header_v2("tell", "client/0", "bench/0", "sink", i + 1, codec.new_trace_id(),
                                                 None)),
                   msgpack.packb({"x": i})] for i in range(n * rounds)]
        on_router = actor.mailbox._on_router
        best = float("inf")
        for r in range(rounds):
            chunk = frames[r * n:(r + 1) * n]
            t0 = time.perf_counter()
            for f in chunk:
                on_router(f)
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
            if actor.tracer is not None:
                actor.tracer.flush()
        if actor.received != n * rounds:
            raise AssertionError(f"the actor handled {actor.received} of {n * rounds} tells")
        return best
    finally:
        await actor.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tells", type=int, default=40000, help="tells per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2, help="traced/untraced pairs, alternating")
    args = ap.parse_args(argv)
    import uvloop
    from slime_actors.log import setup_logging
    setup_logging(tempfile.mkdtemp(prefix="slime-trace-cost-log-"), "bench", console=False, level="warning")
    on, off = [], []
    for _ in range(args.repeats):
        on.append(uvloop.run(_per_tell_us(True, args.tells, args.rounds)))
        off.append(uvloop.run(_per_tell_us(False, args.tells, args.rounds)))
    t_on, t_off = min(on), min(off)
    print(f"command: {' '.join(['.venv/bin/python'] + sys.argv)}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs")
    print()
    print("| receiver of a tell, in-process (best round) | us per message |")
    print("|---|---:|")
    print(f"| untraced | {t_off:.2f} |")
    print(f"| traced | {t_on:.2f} |")
    print(f"| tracing's share | {t_on - t_off:.2f} ({(t_on - t_off) / t_on:.0%} of the traced message) |")
    print(f"| throughput on / off if the receiver's Python were all | {t_off / t_on:.2f}x (target >= 0.9x) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
