"""`slime-actors trace summary RUN`: per receiving role and method, counts, bytes, latency percentiles, errors."""

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

    @property
    def count(self) -> int:
        return self.tells + self.asks


def _role(name: str) -> str:
    return name.split("/", 1)[0]


def summarize(run: TraceRun) -> list[MethodStats]:
    stats: dict[tuple[str, str], MethodStats] = {}
    msgs: dict[str, Message] = run.messages()
    for m in msgs.values():
        h = m.header
        kind = h.get("kind")
        if kind not in ("tell", "ask"):
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
        s.slowest = sorted(s.slowest, reverse=True)[:3]
    return sorted(stats.values(), key=lambda s: (s.role, s.method))


def _fmt(v: float | None) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def render(run: TraceRun, slowest: bool = True) -> str:
    rows = summarize(run)
    head = ["role", "method", "tell", "ask", "bytes", "err", "rtt p50 ms", "p95", "p99", "handle p50 ms", "p95",
            "p99"]
    table = [head]
    for s in rows:
        table.append([s.role, s.method, str(s.tells), str(s.asks), _bytes(s.bytes), str(s.errors),
                      _fmt(percentile(s.rtt_ms, 50)), _fmt(percentile(s.rtt_ms, 95)), _fmt(percentile(s.rtt_ms, 99)),
                      _fmt(percentile(s.handle_ms, 50)), _fmt(percentile(s.handle_ms, 95)),
                      _fmt(percentile(s.handle_ms, 99))])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = [f"run {run.root}: {len(run.files)} trace file(s), actors: {', '.join(run.actors())}"]
    for i, r in enumerate(table):
        lines.append("  ".join(c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if slowest:
        worst = sorted(((ms, mid, s.role, s.method) for s in rows for ms, mid in s.slowest), reverse=True)[:5]
        if worst:
            lines.append("")
            lines.append("slowest messages (rtt, or handling time for tells):")
            for ms, mid, role, method in worst:
                lines.append(f"  {ms:10.3f} ms  {role}.{method}  id={mid}")
    drops = sum(1 for f in run.files for e in f.events if e.ev == "drop")
    if drops:
        lines.append(f"\n{drops} message(s) dropped as undecodable (see `trace show --drops`)")
    for p in run.problems:
        lines.append(f"note: {p}")
    return "\n".join(lines)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)
