"""Profiler traces of a run (RUN_DIR/profiles, slime_actors/profiler.py) on the messages' timeline.

`slime-actors trace export RUN` puts, on each actor's track, beside its messages and handler spans, what the torch
profiler recorded in that process: CPU ops, user ranges (named after the message that caused them:
"train_overall rollout 10 m:<message id>"), GPU kernels and memory counters; an engine's profile (SGLang's
/start_profile, or the local engine's) goes on its rollout worker's track.

Clocks. The traces' times are the wall clock (time.time_ns). The torch profiler's are its own (Kineto's, in
microseconds). Each of our profiles holds a range CLOCK_MARK whose wall-clock time was read around it (the tightest of
five reads, typically a few microseconds wide) and written in a sidecar `<name>.clock.json`: the offset that puts the
range's middle at that time aligns every event of the file. A profile without a sidecar (SGLang's own) is placed by
Kineto's `baseTimeNanoseconds` (its events' ts are microseconds after it, on the wall clock as the process read it
when the profiler started). tests/test_profiles.py checks that a trainer's range lands inside the handling of the
message it names, to 1 ms.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..json_files import read_small_json

PROFILES = "profiles"  # RUN_DIR/profiles: where slime_actors/profiler.py writes
CLOCK_MARK = "slime_actors.clock"  # the range whose wall-clock time a profile's sidecar (.clock.json) holds


@dataclass
class Profile:
    path: Path
    actor: str                  # the track it goes on (a rollout worker's for its engine's profile)
    label: str                  # "torch" or "engine"
    events: list[dict]
    offset_ns: float            # wall_ns = ts_us * 1000 + offset_ns
    aligned_by: str             # "clock mark" | "baseTimeNanoseconds"
    uncertainty_ns: int = 0
    meta: dict = field(default_factory=dict)

    def wall_ns(self, ts_us: float) -> float:
        return ts_us * 1000.0 + self.offset_ns


def profiles_root(run_root: Path) -> Path | None:
    """RUN/profiles for a run directory, its traces/ folder or a trace file in it."""
    for d in (run_root, run_root.parent, run_root.parent.parent):
        if (d / PROFILES).is_dir():
            return d / PROFILES
    return None


def _load(path: Path) -> dict:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return json.loads(data)


def load_profiles(run_root: Path, actors: list[str]) -> tuple[list[Profile], list[str]]:
    """Every profile of the run that can be placed, and notes on those that cannot."""
    root = profiles_root(run_root)
    if root is None:
        return [], []
    out, notes = [], []
    for path in sorted([*root.rglob("*.trace.json.gz"), *root.rglob("*.trace.json")]):
        sidecar = path.with_name(path.name.split(".pt.trace.json")[0].split(".trace.json")[0] + ".clock.json")
        meta = read_small_json(sidecar) or {}
        actor = meta.get("actor")
        label = "torch"
        if actor is None and path.parent.name.startswith("engine-"):
            actor, label = path.parent.name[len("engine-"):].replace("-", "/", 1), "engine"
        if actor not in actors:
            notes.append(f"{path}: no actor of this run to put it on ({actor or 'unknown'})")
            continue
        try:
            data = _load(path)
        except (OSError, ValueError) as exc:
            notes.append(f"{path}: not a readable profiler trace ({exc})")
            continue
        events = [e for e in data.get("traceEvents", []) if isinstance(e, dict)]
        clock = meta.get("clock") or {}
        mark = next((e for e in events if e.get("name") == CLOCK_MARK and e.get("ph") == "X"), None)
        if mark is not None and clock.get("wall_ns"):
            offset = clock["wall_ns"] - (float(mark["ts"]) + float(mark.get("dur", 0)) / 2) * 1000.0
            how, unc = "clock mark", int(clock.get("uncertainty_ns", 0))
        elif isinstance(data.get("baseTimeNanoseconds"), int):
            offset, how, unc = float(data["baseTimeNanoseconds"]), "baseTimeNanoseconds", 0
        else:
            notes.append(f"{path}: neither a clock mark nor baseTimeNanoseconds: cannot place it in time")
            continue
        out.append(Profile(path, actor, label, events, offset, how, unc, meta))
    return out, notes


MEMORY = "[memory]"


def trace_events(profiles: list[Profile], pid_of: dict[str, int], us_of) -> list[dict]:
    """The profiles' events in the export's trace-event form: on their actor's process track, in lanes (tids) of
    their own (1000 + k, named after the profiler's thread or GPU stream), times as `us_of(wall_ns)`; memory
    instants become counters ("memory: <actor>"); flow and metadata events of the profiler are left out."""
    out: list[dict] = []
    for n, prof in enumerate(profiles):
        pid = pid_of[prof.actor]
        lanes: dict[tuple, int] = {}
        names: dict[tuple, str] = {}
        for e in prof.events:
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                names[(e.get("pid"), e.get("tid"))] = str((e.get("args") or {}).get("name", ""))
        for e in prof.events:
            ph = e.get("ph")
            if ph not in ("X", "i", "I") or "ts" not in e:
                continue
            ts = us_of(prof.wall_ns(float(e["ts"])))
            if e.get("name") == MEMORY:
                args = e.get("args") or {}
                if "Total Allocated" in args:
                    out.append({"ph": "C", "name": f"memory ({prof.label})", "pid": pid, "ts": ts,
                                "args": {"allocated": args["Total Allocated"],
                                         "reserved": args.get("Total Reserved", 0)}})
                continue
            key = (e.get("pid"), e.get("tid"))
            if key not in lanes:
                lanes[key] = 1000 + 100 * n + len(lanes)
                what = names.get(key) or (f"stream {e.get('tid')}" if e.get("cat") in ("kernel", "gpu_memcpy",
                                                                                        "gpu_memset")
                                          else f"thread {e.get('tid')}")
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": lanes[key],
                            "args": {"name": f"{prof.label}: {what}"}})
            ev = {"ph": ph, "name": e.get("name", "?"), "cat": f"profile.{e.get('cat', 'op')}", "pid": pid,
                  "tid": lanes[key], "ts": ts}
            if ph == "X":
                ev["dur"] = float(e.get("dur", 0))
            else:
                ev["s"] = "t"
            args = dict(e.get("args") or {})
            name = str(e.get("name", ""))
            if " m:" in name:
                args["message"] = name.rsplit(" m:", 1)[1].split()[0]
            if args:
                ev["args"] = args
            out.append(ev)
    return out
