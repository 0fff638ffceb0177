"""A debugging aid: the heap growth of chosen actors, written to the run directory while the job runs.

    SLIME_ACTORS_HEAPWATCH=buffer slime-actors train ... --heartbeat-liveness 120     # the buffer (a role, or a
    SLIME_ACTORS_HEAPWATCH=buffer,rollout/0 SLIME_ACTORS_HEAPWATCH_EVERY=120 ...      # name: rollout/0)

An actor it names starts tracemalloc (the stdlib's heap tracer, 8 frames) once it is started, takes a first
snapshot after SLIME_ACTORS_HEAPWATCH_EVERY seconds (the warm-up: first allocations), and then every as many seconds
rewrites RUN_DIR/heapwatch/<role>-<index>.txt: the Python heap now against that first snapshot, the largest growths
by allocation site (and the traceback of each), the process's RSS and what glibc's malloc holds (in use; freed but
kept), and the asyncio tasks alive. tracemalloc slows the process (2-4x on its event loop) and the snapshot stalls
the loop for a moment: raise --heartbeat-liveness so the actor is not declared down meanwhile. For finding a leak
(docs/performance.md, *Long runs*: how the buffer's growth was found), not for runs whose speed matters.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
import tracemalloc
from collections import Counter
from pathlib import Path

from .env import HEAPWATCH, HEAPWATCH_EVERY

FRAMES = 8
TOP = 25


def wanted(name: str, role: str) -> bool:
    """Whether SLIME_ACTORS_HEAPWATCH names this actor (by role or by name)."""
    raw = HEAPWATCH.get() or ""
    names = {n.strip() for n in raw.split(",") if n.strip()}
    return name in names or role in names


def report(first: tracemalloc.Snapshot, now: tracemalloc.Snapshot, *, elapsed: float, label: str) -> str:
    """The heap now against the first snapshot: totals, then the TOP largest growths with their tracebacks."""
    filters = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib*")]
    first, now = first.filter_traces(filters), now.filter_traces(filters)
    total0 = sum(s.size for s in first.statistics("filename"))
    total1 = sum(s.size for s in now.statistics("filename"))
    lines = [f"{label}: Python heap {total0 / 2**20:.1f} -> {total1 / 2**20:.1f} MiB "
             f"({(total1 - total0) / 2**20:+.2f} MiB) over {elapsed:.0f} s since the first snapshot", ""]
    by_line = sorted(now.compare_to(first, "lineno"), key=lambda d: -d.size_diff)[:TOP]
    lines.append("largest growths by line:")
    for d in by_line:
        lines.append(f"  {d.size_diff / 2**10:+10.1f} KiB {d.count_diff:+8d} blocks  {d.traceback[0]}")
    lines += ["", "largest growths by traceback:"]
    for d in sorted(now.compare_to(first, "traceback"), key=lambda d: -d.size_diff)[:8]:
        lines.append(f"  {d.size_diff / 2**10:+10.1f} KiB {d.count_diff:+8d} blocks")
        lines += [f"      {fr}" for fr in d.traceback.format()[-2 * FRAMES:]]
    return "\n".join(lines) + "\n"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def native() -> str:
    """The process's RSS and, on glibc, what malloc holds: in use, free but kept (in its heaps), mapped."""
    rss = next((int(line.split()[1]) / 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmRSS:")), float("nan"))
    out = f"RSS {rss:.1f} MiB"
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):  # not glibc >= 2.33
        return out + "\n"
    fn.restype = _MallInfo2
    m = fn()
    mib = 2**20
    return (out + f"; malloc: in use {m.uordblks / mib:.1f} MiB, free but kept in its heaps "
            f"{m.fordblks / mib:.1f} MiB (heaps {m.arena / mib:.1f} MiB), mapped blocks {m.hblkhd / mib:.1f} MiB\n")


def tasks_alive() -> str:
    names = Counter(t.get_name().split(":")[-1] for t in asyncio.all_tasks())
    return "asyncio tasks alive: " + ", ".join(f"{n} x{c}" for n, c in names.most_common(20)) + "\n"


async def watch(name: str, run_dir: str) -> None:
    """Trace the heap of this process and rewrite its report every SLIME_ACTORS_HEAPWATCH_EVERY seconds."""
    every = float(HEAPWATCH_EVERY.get())
    out = Path(run_dir) / "heapwatch" / (name.replace("/", "-") + ".txt")
    out.parent.mkdir(parents=True, exist_ok=True)
    if not tracemalloc.is_tracing():
        tracemalloc.start(FRAMES)
    loop = asyncio.get_running_loop()
    await asyncio.sleep(every)
    # in a thread: the comparison takes seconds (the loop still stalls while the snapshot copies the traces, which
    # holds the GIL: with a large heap raise --heartbeat-liveness so the actor is not declared down meanwhile)
    first, t0 = await loop.run_in_executor(None, tracemalloc.take_snapshot), time.monotonic()
    while True:
        await asyncio.sleep(every)
        now = await loop.run_in_executor(None, tracemalloc.take_snapshot)
        label = f"{name} (pid {os.getpid()})"
        text = await loop.run_in_executor(None, lambda: report(first, now, elapsed=time.monotonic() - t0,
                                                                  label=label))
        text += "\n" + native() + tasks_alive()
        tmp = out.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, out)
