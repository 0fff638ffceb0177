"""Where the time to the first step goes: each process's start-up phases, and the breakdown the controller prints
at the end of the first step (and writes to RUN_DIR/startup.json).

Every process keeps its own phases (wall-clock seconds since the epoch, so processes on one host line up):

    from slime_actors import startup_timeline as timeline
    with timeline.phase("model load"):           # a named span of this process's start-up
        ...
    timeline.snapshot()                          # {"process_start": t, "phases": [[name, t0, t1], ...]}

`process_start` is when the kernel started the process (/proc/self/stat), so the interpreter's own start and the
imports before the first line of ours are counted too. An actor process hands its snapshot to the supervisor in its
start-up report (launch/startup.py, RUN_DIR/logs/ROLE-INDEX.start.json); the controller, in the head process, reads
them and puts the breakdown together (`breakdown`, `format_breakdown`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from .json_files import read_small_json

_PHASES: list[list] = []


def process_start(pid: int | str = "self") -> float:
    """When the kernel started process `pid` (seconds since the epoch); now when /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])          # starttime: clock ticks after boot (field 22 of stat)
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return time.time()


def mark(name: str, start: float, end: float | None = None) -> None:
    """Record a phase that ran from `start` to `end` (default: now)."""
    _PHASES.append([name, float(start), float(time.time() if end is None else end)])


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    t0 = time.time()
    try:
        yield
    finally:
        mark(name, t0)


def snapshot() -> dict:
    return {"process_start": process_start(), "phases": [list(p) for p in _PHASES]}


def reset() -> None:
    """Forget the phases (a test's, or a restarted actor's in the same process)."""
    _PHASES.clear()


# ---------------------------------------------------------------------------------------------------- the report
def breakdown(run_dir: str | os.PathLike, head: dict, steps: list[list], first_step_end: float) -> dict:
    """The start-up of a job, times relative to the head process's start: the head's phases, each actor's (from
    its start-up report) and the controller's steps up to the end of the first step (`steps`: [name, t0, t1]).
    Actors whose report is not readable here (another host's run directory) are left out."""
    t0 = head["process_start"]

    def rel(phases):
        return [[n, round(a - t0, 3), round(b - t0, 3)] for n, a, b in phases]
    actors = {}
    for path in sorted((Path(run_dir) / "logs").glob("*.start.json")):
        body = read_small_json(path)
        times = body.get("times") if body is not None else None
        if not isinstance(times, dict) or body.get("state") != "ready":
            continue
        role, _, index = path.name[:-len(".start.json")].rpartition("-")
        name = f"{role}/{index}"
        actors[name] = {"process_start": round(times["process_start"] - t0, 3), "phases": rel(times["phases"]),
                        "ready": round(float(body.get("ready_at", times["process_start"])) - t0, 3)}
    return {"total_s": round(first_step_end - t0, 3), "head": {"phases": rel(head["phases"])},
            "actors": actors, "steps": rel(steps)}


def _spans(phases: list, start: float) -> str:
    """'name 1.2 | name 0.3' (seconds) in the order the phases started, the gaps between phases named '(other)' when
    over 0.05 s; a phase that ran alongside one before it (the rollout worker's tokenizer while its engine starts)
    says so."""
    out, t = [], start
    for name, a, b in sorted(phases, key=lambda p: p[1]):
        if a - t > 0.05:
            out.append(f"(other) {a - t:.1f}")
        out.append(f"{name} {b - a:.1f}" + (" (alongside)" if a < t - 0.05 else ""))
        t = max(t, b)
    return " | ".join(out)


def format_breakdown(b: dict) -> list[str]:
    """The breakdown as console lines (seconds)."""
    lines = [f"start-up: {b['total_s']:.1f} s from the launch to the end of the first step"]
    head = b["head"]["phases"]
    if head:
        first = min(p[1] for p in head)
        lines.append(f"  head         python + imports {first:.1f} | {_spans(head, first)}")
    for name, a in sorted(b["actors"].items(), key=lambda kv: kv[1]["ready"]):
        first = min(p[1] for p in a["phases"]) if a["phases"] else a["ready"]
        lines.append(f"  {name:<12} started at {a['process_start']:.1f} | python + imports "
                     f"{first - a['process_start']:.1f} | {_spans(a['phases'], first)} -> ready at {a['ready']:.1f}")
    if b["steps"]:
        lines.append(f"  controller   {_spans(b['steps'], b['steps'][0][1])} -> {b['total_s']:.1f}")
    return lines
