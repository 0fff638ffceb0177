"""Questions asked of a run's traces: its time base, where step K lies, a message by (a prefix of) its id, the causal
chain around a message, and readable renderings of events and bodies. Used by `slime-actors trace ...`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from .reader import Event, Message, TraceFormatError, TraceRun

# Methods that carry the mailbox's own plumbing rather than the job's work.
PLUMBING = frozenset(("register", "watch", "deregister", "lookup", "heartbeat"))


class QueryError(ValueError):
    """A question the run cannot answer (unknown id, step, actor): the message says why."""


def run_start_ns(run: TraceRun) -> int:
    """Time zero of a run: the earliest trace file start (or record)."""
    starts = [f.meta.get("started_ns") for f in run.files if isinstance(f.meta.get("started_ns"), int)]
    starts += [f.events[0].t_ns for f in run.files if f.events]
    if not starts:
        return 0
    return min(starts)


def run_end_ns(run: TraceRun) -> int:
    ends = [e.t_ns for f in run.files for e in f.events[-1:]]
    return max(ends) if ends else run_start_ns(run)


def rel(t_ns: int, t0: int) -> str:
    return f"+{(t_ns - t0) / 1e9:.6f}s"


def parse_time(text: str | None, t0: int) -> int | None:
    """'12.5', '12.5s', '+12.5s' (seconds from the run's start) or '1700000000.5' (Unix seconds) -> ns."""
    if text is None:
        return None
    s = text.strip().lstrip("+").removesuffix("s")
    try:
        v = float(s)
    except ValueError:
        raise QueryError(f"cannot read time {text!r}: give seconds from the run's start (e.g. 12.5) or Unix "
                         "seconds") from None
    if v > 1e9:  # an absolute time
        return int(v * 1e9)
    return t0 + int(v * 1e9)


# ------------------------------------------------------------------------------------------------------- steps
@dataclass
class Step:
    rollout_id: int
    start_ns: int
    end_ns: int


def steps(run: TraceRun) -> dict[int, Step]:
    """Training steps as the controller ran them.

    Step K starts when the controller asks the buffer for rollout K (start_rollout of kind train -- not the one that
    makes its groups ahead, held, while step K-1 trains --, or load_rollout with --load-debug-rollout-data) and ends when step K+1 starts or when K's mark_trained and the weight sync sent
    with it are answered, whichever is later (with --async-train rollout K+1 starts while K trains)."""
    ctl = [f for f in run.files if f.meta.get("role") == "controller" or f.meta.get("actor", "").startswith(
        "controller/")]
    if not ctl:
        raise QueryError(f"{run.root}: no controller trace, so no step boundaries (actors: "
                         f"{', '.join(run.actors())})")
    msgs = run.messages()
    starts: dict[int, int] = {}
    marks: dict[int, Message] = {}
    syncs: list[Message] = []
    for f in ctl:
        for e in f.events:
            if e.ev != "send" or e.kind not in ("ask", "tell"):
                continue
            m = e.method
            if m in ("start_rollout", "load_rollout", "mark_trained"):
                body = _safe_body(e)
                if not isinstance(body, dict) or not isinstance(body.get("rollout_id"), int):
                    continue
                k = body["rollout_id"]
                if m == "mark_trained":
                    marks.setdefault(k, msgs.get(e.id))
                elif m == "load_rollout" or (body.get("kind", "train") == "train" and not body.get("hold")):
                    starts.setdefault(k, e.t_ns)
            elif m == "sync_weights":
                mm = msgs.get(e.id)
                if mm is not None:
                    syncs.append(mm)
    end_of_run = run_end_ns(run)
    out: dict[int, Step] = {}
    order = sorted(starts)
    for i, k in enumerate(order):
        ends = []
        if i + 1 < len(order):
            ends.append(starts[order[i + 1]])
        mark = marks.get(k)
        if mark is not None:
            ends.append(_answered(mark))
            # the sync that follows the mark (sent while the buffer frees the rollout, since 2026-12-06; after its
            # answer before)
            t_mark = mark.send.t_ns if mark.send is not None else _answered(mark)
            after = [s for s in syncs if s.send is not None and s.send.t_ns >= t_mark]
            if after:
                ends.append(_answered(min(after, key=lambda s: s.send.t_ns)))
        out[k] = Step(k, starts[k], max(ends) if ends else end_of_run)
    return out


def step_window(run: TraceRun, k: int) -> Step:
    st = steps(run)
    if k not in st:
        have = f"{min(st)}..{max(st)}" if st else "none"
        raise QueryError(f"{run.root}: no step {k} in this run (steps: {have})")
    return st[k]


def trained_batches(run: TraceRun, rank: str = "trainer/0") -> dict[int, dict]:
    """The batch trainer rank `rank` trained on in each step, by rollout id, as it came (packed:
    types.batch_as_lists gives lists): the shard it asked for ahead (its `wait_batch` reply) when that is the batch its
    `train` named, else the one it pulled (`get_batch`). A batch over the trace's batch limit is left out."""
    named: dict[int, Any] = {}
    ahead: dict[int, dict] = {}
    pulled: dict[int, dict] = {}
    for m in run.messages().values():
        if m.method == "train" and m.header.get("to") == rank and (m.send or m.recv) is not None:
            body = _safe_body(m.send or m.recv)
            if isinstance(body, dict) and isinstance(body.get("rollout_id"), int):
                named[body["rollout_id"]] = body.get("batch_id")
            continue
        if m.method not in ("get_batch", "wait_batch") or m.header.get("from") != rank or m.reply is None:
            continue
        ask, got = _safe_body(m.send) if m.send is not None else None, _safe_body(m.reply)
        if not isinstance(ask, dict) or not isinstance(got, dict) or got.get("__omitted__"):
            continue
        if m.method == "get_batch":
            pulled[ask["rollout_id"]] = got
        elif isinstance(got.get("batch"), dict):
            ahead[ask["rollout_id"]] = got
    out = {}
    for k, batch_id in named.items():
        if k in pulled:
            out[k] = pulled[k]
        elif k in ahead and batch_id is not None and ahead[k].get("batch_id") == batch_id:
            out[k] = ahead[k]["batch"]
    return out


def _answered(m: Message) -> int:
    for e in (m.reply, m.reply_sent, m.handled, m.recv, m.send):
        if e is not None:
            return e.t_ns
    return 0


def _safe_body(e: Event) -> Any:
    try:
        return e.body()
    except TraceFormatError:
        return None


# ------------------------------------------------------------------------------------------------------- ids
def find_message(run: TraceRun, msg_id: str, msgs: dict[str, Message] | None = None) -> tuple[Message, str]:
    """The request a (prefix of a) message id names; a reply's id names the request it answers.
    Returns (message, note)."""
    msgs = run.messages() if msgs is None else msgs
    q = msg_id.strip().lower()
    if len(q) < 4:
        raise QueryError(f"message id {msg_id!r} is too short: give at least 4 hex digits")
    if q in msgs:
        return msgs[q], ""
    hits = [m for mid, m in msgs.items() if mid.startswith(q)]
    if len(hits) == 1:
        return hits[0], ""
    if len(hits) > 1:
        raise QueryError(f"message id prefix {msg_id!r} is ambiguous: {', '.join(sorted(m.id for m in hits)[:10])}")
    # a reply or error: name the request it answers
    for f in run.files:
        for e in f.events:
            h = e.header
            if h and h.get("kind") in ("reply", "error") and str(h.get("id", "")).startswith(q):
                m = msgs.get(h.get("re", ""))
                if m is not None:
                    return m, f"{h['id']} is the {h['kind']} to {m.id}"
    raise QueryError(f"no message with id {msg_id!r} in {run.root} ({len(msgs)} messages; ids are 16 hex digits, "
                     "as `trace show` prints them)")


# ------------------------------------------------------------------------------------------------------- chains
@dataclass
class ChainNode:
    message: Message
    depth: int


def ancestors(m: Message, msgs: dict[str, Message]) -> list[Message]:
    """The messages that led to `m`, root first (each one's handler sent the next)."""
    out: list[Message] = []
    seen = {m.id}
    cur = m
    while True:
        pid = cur.header.get("parent")
        if not pid or pid in seen:
            break
        p = msgs.get(pid)
        if p is None:
            break
        out.append(p)
        seen.add(pid)
        cur = p
    out.reverse()
    return out


def descendants(m: Message, msgs: dict[str, Message], limit: int = 2000) -> list[ChainNode]:
    """Everything `m` caused, depth first in send order."""
    children: dict[str, list[Message]] = {}
    for x in msgs.values():
        p = x.header.get("parent")
        if p and x.header.get("kind") in ("tell", "ask"):
            children.setdefault(p, []).append(x)
    for v in children.values():
        v.sort(key=_t)
    out: list[ChainNode] = []
    stack = [(c, 1) for c in reversed(children.get(m.id, []))]
    seen = {m.id}
    while stack and len(out) < limit:
        c, d = stack.pop()
        if c.id in seen:
            continue
        seen.add(c.id)
        out.append(ChainNode(c, d))
        stack.extend((g, d + 1) for g in reversed(children.get(c.id, [])))
    return out


def _t(m: Message) -> int:
    for e in (m.send, m.recv, m.handled):
        if e is not None:
            return e.t_ns
    return 0


def outcome(m: Message) -> str:
    """ok | error: ... | rejected: ... | unanswered | cached | '' (a tell not handled yet)."""
    h = m.handled
    if h is not None and h.extra:
        o = h.extra.get("outcome", "?")
        if o in ("error", "rejected"):
            return f"{o}: {h.extra.get('error', '')}"
        if o != "ok":
            return o
    if m.header.get("kind") == "ask":
        if m.reply is not None:
            if m.reply.header.get("kind") == "error":
                b = _safe_body(m.reply)
                if isinstance(b, dict):
                    return f"error: {b.get('type', '')}: {b.get('message', '')}"
                return "error"
            return "ok"
        if m.reply_sent is not None:
            return "ok (reply not seen by the asker)"
        if h is None:
            return "unanswered"
    return "ok" if h is not None else ""


def describe(m: Message, t0: int) -> str:
    h = m.header
    parts = [rel(_t(m), t0), f"{h.get('from', '?')} -> {h.get('to', '?')}", h.get("kind", "?"), h.get("method", "?"),
             f"id={m.id}"]
    if m.rtt_ns is not None:
        parts.append(f"rtt {m.rtt_ns / 1e6:.3f} ms")
    elif m.handle_ns is not None:
        parts.append(f"handled in {m.handle_ns / 1e6:.3f} ms")
    o = outcome(m)
    if o:
        parts.append(o if len(o) < 200 else o[:200] + "...")
    return "  ".join(parts)


# ------------------------------------------------------------------------------------------------------- bodies
def render_value(v: Any, max_chars: int = 400) -> str:
    """A body as compact JSON (bytes as <N bytes>, arrays as dtype[shape] #checksum), cut at max_chars (0: all)."""
    text = json.dumps(_jsonable(v), separators=(", ", ": "), ensure_ascii=False)
    if max_chars and len(text) > max_chars:
        return text[:max_chars] + f" ... ({len(text)} chars; --full shows all)"
    return text


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        if "__array__" in v and "shape" in v:
            return f"<{v['__array__']}{list(v['shape'])} #{v.get('hash')}>"
        if v.get("__omitted__"):
            return f"<body of {v.get('size')} bytes over the trace's body limit, checksum {v.get('hash')}>"
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray, memoryview)):
        return f"<{len(v)} bytes>"
    if isinstance(v, float) and v != v:
        return "NaN"
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if hasattr(v, "tolist") and hasattr(v, "shape"):  # an array kept with --trace-keep-arrays
        return f"<{getattr(v, 'dtype', '?')}{list(v.shape)}>"
    return repr(v)


def event_line(e: Event, t0: int) -> str:
    """One line per record: time, actor, event, direction, method, id, size, outcome."""
    when = rel(e.t_ns, t0)
    if e.ev == "input":
        key = (e.extra or {}).get("key")
        return f"{when}  {e.actor}  input  {e.name}" + (f"  key={key}" if key else "") + f"  {e.body_size}B"
    if e.ev == "drop":
        x = e.extra or {}
        return f"{when}  {e.actor}  drop  {x.get('size', '?')}B  reason: {x.get('reason', '?')}"
    h = e.header or {}
    kind = h.get("kind", "?")
    if e.ev == "send":
        peer = f"-> {h.get('to', '?')}"
    elif e.ev == "recv":
        peer = f"<- {h.get('from', '?')}"
    else:
        peer = f"<- {h.get('from', '?')}"
    parts = [when, e.actor, e.ev, kind, peer, h.get("method", "?"), f"id={h.get('id', '?')}"]
    if kind in ("reply", "error"):
        parts.append(f"re={h.get('re', '?')}")
    elif h.get("parent"):
        parts.append(f"parent={h['parent']}")
    if e.ev in ("send", "recv"):
        size = e.body_size + sum(a[3] for a in e.arrays or () if isinstance(a[3], int))
        parts.append(f"{size}B")
    if e.ev == "handled" and e.extra:
        x = e.extra
        o = x.get("outcome", "?")
        parts.append(f"{o} in {x.get('dur_ns', 0) / 1e6:.3f} ms")
        if x.get("error"):
            parts.append(str(x["error"])[:300])
    return "  ".join(parts)


def select_events(run: TraceRun, *, actor: str | None = None, methods: Iterable[str] = (),
                  kinds: Iterable[str] = (), events: Iterable[str] = (), since: int | None = None,
                  until: int | None = None, msg_id: str | None = None) -> list[Event]:
    """Records matching every filter given, by time. Without `actor`, `events` and `msg_id`, a message sent and
    received between two traced actors is listed once (its send)."""
    actors = set(run.actors())
    if actor is not None and actor not in actors:
        raise QueryError(f"no actor {actor!r} in {run.root} (actors: {', '.join(sorted(actors))})")
    methods, kinds, evs = set(methods), set(kinds), set(events)
    bad = evs - {"send", "recv", "handled", "input", "drop"}
    if bad:
        raise QueryError(f"unknown event kind(s) {sorted(bad)}: send, recv, handled, input, drop")
    out = []
    for e in run.events(actor):
        if since is not None and e.t_ns < since:
            continue
        if until is not None and e.t_ns > until:
            continue
        if evs and e.ev not in evs:
            continue
        if not evs and actor is None and msg_id is None and e.ev == "recv" and e.header \
                and e.header.get("from") in actors and e.header.get("kind") != "hb":
            continue  # its send is listed
        if methods:
            name = e.method if e.header else e.name
            if name not in methods:
                continue
        if kinds:
            k = e.kind if e.header else e.ev
            if k not in kinds:
                continue
        if msg_id is not None:
            h = e.header or {}
            if not (str(h.get("id", "")).startswith(msg_id) or str(h.get("re", "")).startswith(msg_id)):
                continue
        out.append(e)
    return out
