"""What tracing costs the receiver of a tell, per message, in-process (issue 2's "tracing costs <= 10 %").

    .venv/bin/python bench/trace_cost.py

The receiver is what limits bench/mailbox.py's pipelined figure (its CPU is at 100 %, the sender's at ~55 %), and
its per-message Python is what tracing adds to. This drives an echo actor's ROUTER callback (`Mailbox._on_router`:
header decode, dispatch, the `sink` handler, the trace record) with prebuilt frames, traced and untraced, in
alternating rounds, and prints the best round of each: no sockets, no second process, so the difference is the
tracing work itself (the writer thread's share is left out: it drains between rounds).

A second table does the same with an `async` handler (a task per tell, two steps: it awaits once), traced with and
without the actor's schedule (the order its tasks ran, which replay follows: slime_actors/actors/schedule.py), so
the schedule's own share shows: one record per step of a task.
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

from slime_actors.actors.base import handler  # noqa: E402
from slime_actors.actors.host import Host  # noqa: E402
from slime_actors.mailbox import codec  # noqa: E402
from slime_actors.runtime import RuntimeConfig  # noqa: E402


class AsyncEcho(BenchEcho):
    """BenchEcho with an async sink: each tell is a task of two steps."""

    @handler
    async def asink(self, x=None) -> None:
        await asyncio.sleep(0)
        self.received += 1


class NoScheduleHost(Host):
    """The real host, except that the actor's schedule is not recorded (to measure what recording it costs)."""

    def schedule(self, actor):
        return None


STEPS_PER_TELL = 2  # AsyncEcho.asink's steps: to its await, and after it
CLOCK = time.perf_counter  # --clock thread: time.thread_time


async def _per_tell_us(trace: bool, n: int, rounds: int, method: str = "sink", schedule: bool = True) -> float:
    run_dir = tempfile.mkdtemp(prefix="slime-trace-cost-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    actor = BenchEcho(0) if method == "sink" else AsyncEcho(0)
    await actor.start(RuntimeConfig(run_dir=run_dir, curve=False, trace=trace),
                      host=None if schedule else NoScheduleHost())
    try:
        frames = [[b"client/0#1#000000",
                   msgpack.packb(codec.header_v2("tell", "client/0", "bench/0", method, i + 1, codec.new_trace_id(),
                                                 None)),
                   msgpack.packb({"x": i})] for i in range(n * rounds)]
        on_router = actor.mailbox._on_router
        best = float("inf")
        for r in range(rounds):
            chunk = frames[r * n:(r + 1) * n]
            t0 = CLOCK()
            if method == "sink":
                for f in chunk:
                    on_router(f)
            else:  # the tasks run between batches (as the loop would run them between socket reads)
                for i in range(0, n, 64):
                    for f in chunk[i:i + 64]:
                        on_router(f)
                    while actor.received < r * n + min(n, i + 64):
                        await asyncio.sleep(0)
            best = min(best, (CLOCK() - t0) / n * 1e6)
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
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="wall: elapsed time; thread: the event loop thread's CPU time (steadier on a shared machine)")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.thread_time if args.clock == "thread" else time.perf_counter
    import uvloop
    from slime_actors.log import setup_logging
    setup_logging(tempfile.mkdtemp(prefix="slime-trace-cost-log-"), "bench", console=False, level="warning")
    on, off = [], []
    for _ in range(args.repeats):
        on.append(uvloop.run(_per_tell_us(True, args.tells, args.rounds)))
        off.append(uvloop.run(_per_tell_us(False, args.tells, args.rounds)))
    t_on, t_off = min(on), min(off)
    print(f"command: {' '.join(['.venv/bin/python'] + sys.argv)}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; clock: {args.clock}")
    print()
    print("| receiver of a tell, in-process (best round) | us per message |")
    print("|---|---:|")
    print(f"| untraced | {t_off:.2f} |")
    print(f"| traced | {t_on:.2f} |")
    print(f"| tracing's share | {t_on - t_off:.2f} ({(t_on - t_off) / t_on:.0%} of the traced message) |")
    print(f"| throughput on / off if the receiver's Python were all | {t_off / t_on:.2f}x (target >= 0.9x) |")
    a_on, a_nosched, a_off = [], [], []
    for _ in range(args.repeats):
        a_on.append(uvloop.run(_per_tell_us(True, args.tells, args.rounds, "asink")))
        a_nosched.append(uvloop.run(_per_tell_us(True, args.tells, args.rounds, "asink", schedule=False)))
        a_off.append(uvloop.run(_per_tell_us(False, args.tells, args.rounds, "asink")))
    t_on, t_ns, t_off = min(a_on), min(a_nosched), min(a_off)
    print()
    print(f"| receiver of a tell to an async handler ({STEPS_PER_TELL} steps), in-process (best round) "
          "| us per message |")
    print("|---|---:|")
    print(f"| untraced | {t_off:.2f} |")
    print(f"| traced, schedule not recorded | {t_ns:.2f} |")
    print(f"| traced | {t_on:.2f} |")
    print(f"| the schedule's share | {t_on - t_ns:.2f} ({(t_on - t_ns) / t_on:.0%} of the traced message; "
          f"{(t_on - t_ns) / STEPS_PER_TELL * 1000:.0f} ns a step) |")
    print(f"| throughput on / off | {t_off / t_on:.2f}x (without the schedule {t_off / t_ns:.2f}x) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
