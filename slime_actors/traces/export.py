"""`slime-actors trace export RUN -o run.json`: the run in the Chrome/Perfetto trace-event format.

Open the file in https://ui.perfetto.dev (or chrome://tracing). Layout:

* one process track per actor (named `role/index`, sorted controller, buffer, rollout, reward, trainer, directory);
  inside it as many thread lanes as it needed to show overlapping work (async handlers run concurrently);
* a slice per handled message on the receiver, from its arrival to the end of its handling (and its reply), named
  after the method, with sender, ids, outcome and a body preview as arguments;
* a slice per ask on the asker, from the send to the arrival of the reply ("ask buffer/0.get_batch"), and a short
  slice per tell ("tell rollout/0.resume");
* arrows (flow events "s" -> "f", bound to the enclosing slices with "bp": "e") from each ask or tell to the
  handler that received it, and from the handler back to the ask its reply answered;
* an instant event per recorded input (engine answers, clock readings) and per dropped message;
* with profiles (RUN_DIR/profiles, --use-pytorch-profiler): each process's torch profiler events -- CPU ops, ranges
  named after the message that caused them, GPU kernels, memory counters -- in lanes of its own on its actor's
  track, on the same clock (slime_actors/traces/profiles.py).

Timestamps are microseconds since the run's first record (ts 0 = `trace show`'s +0 s).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .query import _safe_body, render_value, run_start_ns
from .reader import Message, TraceRun

ROLE_ORDER = {"controller": 0, "buffer": 1, "rollout": 2, "reward": 3, "trainer": 4, "directory": 9}
_EPS_US = 1.0  # a slice reaches 1 us beyond the events bound to it, so an arrow's ends are always inside it


def actor_sort_key(name: str) -> tuple:
    role, _, idx = name.partition("/")
    return (ROLE_ORDER.get(role, 5), role, int(idx) if idx.isdigit() else 0)


@dataclass
class Slice:
    actor: str
    name: str
    start_us: float
    end_us: float
    cat: str
    args: dict = field(default_factory=dict)
    lane: int = 0


def _us(t_ns: int, t0: int) -> float:
    return round((t_ns - t0) / 1000.0, 3)


def build(run: TraceRun, *, heartbeats: bool = False, since: int | None = None, until: int | None = None,
          preview_chars: int = 300, profiles: bool | None = None) -> dict:
    """The trace-event document. `profiles`: merge the run's profiler traces (RUN_DIR/profiles: CPU ops, ranges,
    GPU kernels, memory) onto the actors' tracks, clocks aligned (traces/profiles.py); None: when there are any."""
    t0 = run_start_ns(run)
    msgs = run.messages()
    actors = sorted(run.actors(), key=actor_sort_key)
    pid_of = {a: i + 1 for i, a in enumerate(actors)}
    slices: list[Slice] = []
    handler_slice: dict[str, Slice] = {}   # request id -> handler slice on the receiver
    sender_slice: dict[str, Slice] = {}    # request id -> ask/tell slice on the sender

    def in_window(m: Message) -> bool:
        first = m.send or m.recv
        if first is None:
            return False
        if since is not None and first.t_ns < since:
            return False
        return not (until is not None and first.t_ns > until)

    for m in msgs.values():
        h = m.header
        kind = h.get("kind")
        if kind not in (("tell", "ask", "hb") if heartbeats else ("tell", "ask")) or not in_window(m):
            continue
        base = {"id": m.id, "from": h.get("from"), "to": h.get("to"), "kind": kind, "trace": h.get("trace")}
        if h.get("parent"):
            base["parent"] = h["parent"]
        if m.send is not None:
            start = _us(m.send.t_ns, t0)
            end = _us(m.reply.t_ns, t0) if m.reply is not None else start
            args = dict(base)
            if m.send.body_raw is not None or m.send.body_size:
                args["body"] = render_value(_safe_body(m.send), preview_chars)
            if m.reply is not None:
                args["reply"] = render_value(_safe_body(m.reply), preview_chars)
                args["rtt_ms"] = round((m.reply.t_ns - m.send.t_ns) / 1e6, 3)
            sl = Slice(m.send.actor, f"{kind} {h.get('to')}.{h.get('method')}", start - _EPS_US, end + _EPS_US,
                       "ask" if kind == "ask" else "tell", args)
            slices.append(sl)
            sender_slice[m.id] = sl
        if m.recv is not None:
            start = _us(m.recv.t_ns, t0)
            end_ns = max(e.t_ns for e in (m.recv, m.handled, m.reply_sent) if e is not None)
            args = dict(base)
            if m.handled is not None and m.handled.extra:
                x = m.handled.extra
                args["outcome"] = x.get("outcome")
                if x.get("error"):
                    args["error"] = str(x["error"])[:1000]
                if isinstance(x.get("dur_ns"), int):
                    args["handler_ms"] = round(x["dur_ns"] / 1e6, 3)
            if "body" not in args and (m.recv.body_raw is not None or m.recv.body_size):
                args["body"] = render_value(_safe_body(m.recv), preview_chars)
            sl = Slice(m.recv.actor, str(h.get("method")), start - _EPS_US, _us(end_ns, t0) + _EPS_US, "handle",
                       args)
            slices.append(sl)
            handler_slice[m.id] = sl

    _assign_lanes(slices)
    events: list[dict] = []
    for a in actors:
        p = pid_of[a]
        events.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": a}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0, "args": {"sort_index": p}})
    lanes_seen: set[tuple[int, int]] = set()
    for sl in slices:
        p = pid_of[sl.actor]
        if (p, sl.lane) not in lanes_seen:
            lanes_seen.add((p, sl.lane))
            events.append({"ph": "M", "name": "thread_name", "pid": p, "tid": sl.lane,
                           "args": {"name": f"lane {sl.lane}"}})
        events.append({"ph": "X", "name": sl.name, "cat": sl.cat, "pid": p, "tid": sl.lane, "ts": sl.start_us,
                       "dur": round(max(sl.end_us - sl.start_us, _EPS_US), 3), "args": sl.args})

    flow_id = 0

    def flow(name: str, src: Slice, t_src: float, dst: Slice, t_dst: float) -> None:
        nonlocal flow_id
        flow_id += 1
        common = {"name": name, "cat": "message", "id": flow_id}
        events.append({"ph": "s", "pid": pid_of[src.actor], "tid": src.lane, "ts": t_src, **common})
        events.append({"ph": "f", "bp": "e", "pid": pid_of[dst.actor], "tid": dst.lane, "ts": t_dst, **common})

    for mid, dst in handler_slice.items():
        m = msgs[mid]
        src = sender_slice.get(mid)
        if src is not None and m.send is not None and m.recv is not None:
            flow(m.method, src, _us(m.send.t_ns, t0), dst, _us(m.recv.t_ns, t0))
        if src is not None and m.reply is not None and m.reply_sent is not None:
            flow(f"{m.method} reply", dst, _us(m.reply_sent.t_ns, t0), src, _us(m.reply.t_ns, t0))

    for f in run.files:
        p = pid_of.get(f.meta.get("actor", "?"))
        if p is None:
            continue
        for e in f.events:
            if e.ev not in ("input", "drop"):
                continue
            if (since is not None and e.t_ns < since) or (until is not None and e.t_ns > until):
                continue
            name = f"input {e.name}" if e.ev == "input" else "drop"
            events.append({"ph": "i", "s": "t", "name": name, "cat": e.ev, "pid": p, "tid": 0, "ts": _us(e.t_ns, t0),
                           "args": dict(e.extra or {})})
    other = {"run": str(run.root), "t0_unix_ns": t0, "actors": actors, "generator": "slime-actors trace export"}
    if profiles is not False:
        from .profiles import load_profiles, trace_events
        profs, notes = load_profiles(Path(run.root), actors)
        if profiles and not profs and not notes:
            notes = [f"no profiles under {run.root} (record them with --use-pytorch-profiler)"]
        if since is not None or until is not None:
            profs = [p for p in profs if _overlaps(p, since, until)]
        events += trace_events(profs, pid_of, lambda ns: round((ns - t0) / 1000.0, 3))
        other["profiles"] = [{"file": str(p.path), "actor": p.actor, "aligned_by": p.aligned_by,
                              "uncertainty_us": round(p.uncertainty_ns / 1000, 3)} for p in profs]
        if notes:
            other["profile_notes"] = notes
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _overlaps(prof, since: int | None, until: int | None) -> bool:
    ts = [float(e["ts"]) for e in prof.events if "ts" in e and e.get("ph") in ("X", "i", "I")]
    if not ts:
        return False
    lo, hi = prof.wall_ns(min(ts)), prof.wall_ns(max(ts))
    return (since is None or hi >= since) and (until is None or lo <= until)


def _assign_lanes(slices: list[Slice]) -> None:
    """Greedy interval partitioning per actor: a slice goes to the first lane free at its start, so slices on one
    lane never overlap (the trace-event format wants slices on a thread to nest, and ours need not)."""
    by_actor: dict[str, list[Slice]] = {}
    for sl in slices:
        by_actor.setdefault(sl.actor, []).append(sl)
    for lst in by_actor.values():
        lst.sort(key=lambda s: (s.start_us, -s.end_us))
        ends: list[float] = []
        for sl in lst:
            for i, e in enumerate(ends):
                if e <= sl.start_us:
                    sl.lane, ends[i] = i, sl.end_us
                    break
            else:
                sl.lane = len(ends)
                ends.append(sl.end_us)


def export(run: TraceRun, out: str | Path, **kw) -> dict:
    data = build(run, **kw)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    return data
