"""`slime-actors trace summary RUN`: per receiving role and method, counts, bytes, latency percentiles, errors,
the slowest messages, dropped messages and the recorded inputs."""

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


def render(run: TraceRun, slowest: bool = True, rows: list[MethodStats] | None = None, title: str = "") -> str:
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
    for p in run.problems:
        lines.append(f"note: {p}")
    return "\n".join(lines)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)
