"""`slime-actors trace summary RUN`: per receiving role and method, counts, bytes, latency percentiles, errors,
the slowest messages, dropped messages and the recorded inputs; and how long replies waited for their asker's event
loop (`reply_waits`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .reader import Message, TraceRun


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def union_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of `intervals` (start, end) inside [lo, hi]: overlaps count once, empty or inverted
    intervals (end <= start) not at all."""
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi):
        if b <= a:
            continue
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    return total if cur_b is None else total + cur_b - cur_a


@dataclass
class MethodStats:
    role: str
    method: str
    tells: int = 0
    asks: int = 0
    bytes: int = 0
    errors: int = 0
    unanswered: int = 0
    rtt_ms: list[float] = field(default_factory=list)
    handle_ms: list[float] = field(default_factory=list)
    slowest: list[tuple[float, str]] = field(default_factory=list)
    waits: bool = False   # asks that wait by design (a `wait` or `timeout` field): left out of the slowest list

    @property
    def count(self) -> int:
        return self.tells + self.asks


def _role(name: str) -> str:
    return name.split("/", 1)[0]


def summarize(run: TraceRun, *, since: int | None = None, until: int | None = None,
              roles: set[str] | None = None, methods: set[str] | None = None) -> list[MethodStats]:
    """Per (receiving role, method) statistics of the requests sent in [since, until] (ns; None: open)."""
    stats: dict[tuple[str, str], MethodStats] = {}
    msgs: dict[str, Message] = run.messages()
    for m in msgs.values():
        h = m.header
        kind = h.get("kind")
        if kind not in ("tell", "ask"):
            continue
        first = m.send or m.recv
        if first is not None and ((since is not None and first.t_ns < since)
                                  or (until is not None and first.t_ns > until)):
            continue
        if roles and _role(h.get("to", "?")) not in roles:
            continue
        if methods and h.get("method") not in methods:
            continue
        key = (_role(h.get("to", "?")), h.get("method", "?"))
        s = stats.get(key)
        if s is None:
            s = stats[key] = MethodStats(*key)
        if kind == "ask":
            s.asks += 1
        else:
            s.tells += 1
        ev = m.send or m.recv
        if ev is not None:
            s.bytes += ev.body_size + sum(a[3] for a in ev.arrays or ())
        if m.handled is not None and m.handled.extra and m.handled.extra.get("outcome") != "ok":
            s.errors += 1
        elif m.reply is not None and m.reply.header.get("kind") == "error":
            s.errors += 1
        if kind == "ask" and not s.waits and ev is not None and ev.body_raw is not None:
            try:
                b = ev.body()
            except Exception:
                b = None
            s.waits = isinstance(b, dict) and ("wait" in b or "timeout" in b)
        if m.rtt_ns is not None:
            s.rtt_ms.append(m.rtt_ns / 1e6)
            s.slowest.append((m.rtt_ns / 1e6, m.id))
        elif kind == "ask" and m.send is not None and m.reply is None:
            s.unanswered += 1
        if m.handle_ns is not None:
            s.handle_ms.append(m.handle_ns / 1e6)
            if m.rtt_ns is None:
                s.slowest.append((m.handle_ns / 1e6, m.id))
    for s in stats.values():
        s.slowest = sorted(s.slowest, reverse=True)[:5]
    return sorted(stats.values(), key=lambda s: (s.role, s.method))


def reply_waits(run: TraceRun, *, since: int | None = None, until: int | None = None,
                roles: set[str] | None = None, methods: set[str] | None = None) -> dict[tuple[str, str], list[float]]:
    """(asking actor, "role.method") -> milliseconds from each reply's arrival (the asker's `recv` record, made as its
    mailbox reads the reply off the socket) to the step in which the asking task resumed from that ask (its
    schedule's `resume ask` record, version 5): how long the answer waited for the asker's event loop. Near zero
    when the loop was free; long when steps queued before it kept the loop busy (a rollout worker at the end of a
    rollout: docs/debugging.md, *An actor too busy to take its answers*). Replies read in [since, until] (ns);
    `roles` / `methods` filter on the ask's receiving role and method, as `summarize` does.

    A step's record is written when the step ends, after the events it made: an ask's `send` is the task's whose
    record comes next in the file and began before it (a send made outside any tracked step -- the runtime's own
    tasks -- is not attributed). Asks to the directory are left out: the mailbox makes them inside another ask (a
    peer's address), where the task's steps are not recorded."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for f in run.files:
        if not f.schedule:
            continue
        items = sorted([(e.offset, 0, e) for e in f.events] + [(st.offset, 1, st) for st in f.schedule],
                       key=lambda x: (x[0], x[1]))
        sends: list = []                           # ask sends since the last step record
        owner: dict[str, tuple[str, str]] = {}     # ask id -> (its task, "role.method")
        waiting: dict[str, tuple[int, str]] = {}   # task -> (its reply's arrival, "role.method")
        for _, kind, x in items:
            if kind == 0:
                h = x.header
                if h is None:
                    continue
                if x.ev == "send" and h.get("kind") == "ask":
                    sends.append(x)
                elif x.ev == "recv" and h.get("kind") in ("reply", "error"):
                    got = owner.pop(h.get("re", ""), None)
                    if got is not None:
                        waiting[got[0]] = (x.t_ns, got[1])
                continue
            for e in sends:
                h = e.header
                mid, to, method = h.get("id"), h.get("to"), h.get("method")
                if x.t_ns > e.t_ns or not all(type(v) is str for v in (mid, to, method)):
                    continue   # (sent before this step began: not its task's; or a header short of its names)
                to = _role(to)
                if to != "directory" and (not roles or to in roles) and (not methods or method in methods):
                    owner[mid] = (x.task, f"{to}.{method}")
            sends = []
            w = waiting.pop(x.task, None)   # (the task's next step after its reply: its resume from the ask)
            if w is not None and x.resume == "ask" and x.t_ns >= w[0] and (since is None or w[0] >= since) \
                    and (until is None or w[0] <= until):
                out[(f.meta.get("actor", "?"), w[1])].append((x.t_ns - w[0]) / 1e6)
    return dict(out)


def _fmt(v: float | None) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def as_json(rows: list[MethodStats]) -> list[dict]:
    out = []
    for s in rows:
        d = {"role": s.role, "method": s.method, "tells": s.tells, "asks": s.asks, "bytes": s.bytes,
             "errors": s.errors, "unanswered": s.unanswered}
        for name, vals in (("rtt_ms", s.rtt_ms), ("handle_ms", s.handle_ms)):
            d[name] = {f"p{q}": percentile(vals, q) for q in (50, 95, 99)}
            d[name]["max"] = max(vals) if vals else None
        d["slowest"] = [{"ms": ms, "id": mid} for ms, mid in s.slowest]
        out.append(d)
    return out


def render(run: TraceRun, slowest: bool = True, rows: list[MethodStats] | None = None, title: str = "",
           loop_waits: dict[tuple[str, str], list[float]] | None = None) -> str:
    rows = summarize(run) if rows is None else rows
    head = ["role", "method", "tell", "ask", "bytes", "err", "rtt p50 ms", "p95", "p99", "handle p50 ms", "p95",
            "p99"]
    table = [head]
    for s in rows:
        table.append([s.role, s.method, str(s.tells), str(s.asks), _bytes(s.bytes), str(s.errors),
                      _fmt(percentile(s.rtt_ms, 50)), _fmt(percentile(s.rtt_ms, 95)), _fmt(percentile(s.rtt_ms, 99)),
                      _fmt(percentile(s.handle_ms, 50)), _fmt(percentile(s.handle_ms, 95)),
                      _fmt(percentile(s.handle_ms, 99))])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = [f"run {run.root}: {len(run.files)} trace file(s), actors: {', '.join(run.actors())}" + title]
    if not rows:
        lines.append("no messages match")
    for i, r in enumerate(table):
        lines.append("  ".join(c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if slowest:
        worst = sorted(((ms, mid, s.role, s.method) for s in rows if not s.waits for ms, mid in s.slowest),
                       reverse=True)[:5]
        waits = sorted({f"{s.role}.{s.method}" for s in rows if s.waits})
        if worst:
            lines.append("")
            lines.append("slowest messages (rtt, or handling time for tells)"
                         + (f"; asks that wait by design left out: {', '.join(waits)}" if waits else "") + ":")
            for ms, mid, role, method in worst:
                lines.append(f"  {ms:10.3f} ms  {role}.{method}  id={mid}")
    errs = [(s.errors, s.role, s.method) for s in rows if s.errors]
    if errs:
        lines.append("")
        lines.append("errors: " + ", ".join(f"{role}.{method} {n}" for n, role, method in sorted(errs, reverse=True))
                     + "  (see `trace show RUN --method M --events handled`)")
    unanswered = [(s.unanswered, s.role, s.method) for s in rows if s.unanswered]
    if unanswered:
        lines.append("asks never answered: " + ", ".join(f"{role}.{method} {n}" for n, role, method in unanswered))
    drops = sum(1 for f in run.files for e in f.events if e.ev == "drop")
    if drops:
        lines.append(f"\n{drops} message(s) dropped as undecodable (see `trace show RUN --drops`)")
    inputs: dict[tuple[str, str], int] = defaultdict(int)
    for f in run.files:
        for e in f.events:
            if e.ev == "input":
                inputs[(e.actor, e.name or "?")] += 1
    if inputs:
        lines.append("recorded inputs (for replay): " + ", ".join(f"{a} {n} x{c}" for (a, n), c in
                                                                  sorted(inputs.items())))
    if loop_waits is None:
        loop_waits = reply_waits(run)
    if loop_waits:
        lines.append("")
        lines.append("replies waiting for their asker's event loop (a reply read -> its asking task resumed), ms; long "
                     "ones: the asker was busy (docs/debugging.md):")
        rows_w = sorted(((percentile(v, 95) or 0.0, a, m, v) for (a, m), v in loop_waits.items()), reverse=True)[:10]
        wa = max(len(a) for _, a, _, _ in rows_w)
        wm = max(len(m) for _, _, m, _ in rows_w)
        for _, a, m, v in rows_w:
            lines.append(f"  {a.ljust(wa)}  {m.ljust(wm)}  n={len(v):<6} p50 {_fmt(percentile(v, 50)):>7}  "
                         f"p95 {_fmt(percentile(v, 95)):>7}  max {_fmt(max(v)):>7}")
    for p in run.problems:
        lines.append(f"note: {p}")
    return "\n".join(lines)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)
