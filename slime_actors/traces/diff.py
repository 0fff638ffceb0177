"""`slime-actors trace diff RUN_A RUN_B`: where two runs of the same config first part ways.

Message ids, trace ids and timings differ between any two runs, and so does the interleaving of concurrent work, so
messages are not compared in arrival order. Each request is given a key -- sender, receiver, method, kind, and the
fields of its body that say what it is about (rollout_id, work_id, rank, weight_version, sample indices...) -- and
the n-th message with a key in run A is compared with the n-th with that key in run B: its body, its outcome and its
reply, field by field (floats within --rtol/--atol; timings, pids, ports and other machine facts left out, see
compare.VOLATILE_DIFF). The differences found are ordered by when they happened in run A; the first is the
divergence.

Polling and plumbing (get_work, directory traffic, heartbeats, pings) are left out by default: how often a worker
polls depends on timing, not on the computation; what it was handed shows up again in what it submits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .compare import VOLATILE_DIFF, Difference, first_difference
from .query import _safe_body, outcome, rel, run_start_ns
from .reader import Event, Message, TraceRun

IGNORED_METHODS = frozenset(("get_work", "register", "watch", "deregister", "lookup", "list", "heartbeat",
                             "_ping", "_stats", "_peer_down", "_peer_up", "_stop", "status", "engine_info",
                             "engine_ready"))
KEY_FIELDS = ("rollout_id", "kind", "name", "work_id", "worker", "rank", "world_size", "weight_version")
# inputs that describe the machine or the timing of a run, not its computation: clock readings, process ids, free
# ports, an engine process's launch and exit-code polls, health probes and router registrations (taken on timers, so
# their number differs too) -- they differ in any two runs
IGNORED_INPUTS = frozenset(("clock", "clock.monotonic", "start_token", "pid", "engine.port", "engine.launch",
                            "engine.poll", "engine.wait_healthy", "engine.health", "engine.health_generate",
                            "router.port", "router.metrics_port", "router.launch", "router.poll",
                            "router.wait_healthy", "router.has_worker", "router.add_worker", "router.remove_worker",
                            "engine.abort_request",  # (how many requests were still running: the timing's)
                            "environment"))  # the machine's (compared on its own: environment_note)
# run-specific config values (paths, ports) that are not part of "the same config"
CONFIG_IGNORED = frozenset(("run_dir", "save", "load", "hf_checkpoint", "save_debug_rollout_data",
                            "load_debug_rollout_data", "update_weight_disk_dir", "progress", "config"))


@dataclass
class Divergence:
    t_a: int | None
    t_b: int | None
    key: tuple
    what: str                      # "request", "reply", "outcome", "only in A", "only in B"
    diff: Difference | None
    a: Message | Event | None   # a message, or a recorded input
    b: Message | Event | None


def body_ident(body: Any) -> tuple:
    """The fields of a request body that say what it is about (not how it went)."""
    ident: list = []
    if isinstance(body, dict):
        for k in KEY_FIELDS:
            v = body.get(k)
            if isinstance(v, (str, int, float, bool)):
                ident.append((k, v))
        samples = body.get("samples")
        if isinstance(samples, list) and samples and all(isinstance(s, dict) and "index" in s for s in samples):
            ident.append(("samples", tuple(s["index"] for s in samples)))
    return tuple(ident)


def message_key(m: Message) -> tuple:
    h = m.header
    body = _safe_body(m.send or m.recv) if (m.send or m.recv) is not None else None
    return (h.get("from"), h.get("to"), h.get("method"), h.get("kind"), body_ident(body))


def _t(m: Message) -> int:
    for e in (m.send, m.recv):
        if e is not None:
            return e.t_ns
    return 0


def _streams(run: TraceRun, ignore: frozenset) -> dict[tuple, list[Message]]:
    out: dict[tuple, list[Message]] = {}
    for m in run.messages().values():
        h = m.header
        if h.get("kind") not in ("tell", "ask") or h.get("method") in ignore:
            continue
        out.setdefault(message_key(m), []).append(m)
    for v in out.values():
        v.sort(key=_t)
    return out


def _input_streams(run: TraceRun, ignore: frozenset) -> dict[tuple, list[Event]]:
    """Recorded inputs (engine answers...) per actor, name and key: they say first when computation parted ways."""
    out: dict[tuple, list[Event]] = {}
    for f in run.files:
        for e in f.events:
            if e.ev == "input" and e.name not in ignore:
                out.setdefault((e.actor, "input", e.name, (e.extra or {}).get("key")), []).append(e)
    for v in out.values():
        v.sort(key=lambda e: e.t_ns)
    return out


def _reply_body(m: Message) -> Any:
    e = m.reply or m.reply_sent
    return None if e is None else _safe_body(e)


def _request_body(m: Message) -> Any:
    e = m.send or m.recv
    return None if e is None else _safe_body(e)


def config_differences(a: TraceRun, b: TraceRun) -> list[tuple[str, Any, Any]]:
    """Job flags that differ between the runs (from the first actor with recorded job flags in both)."""
    for actor in a.actors():
        try:
            ca, cb = a.meta(actor).get("config"), b.meta(actor).get("config")
        except KeyError:
            continue
        if not (isinstance(ca, dict) and isinstance(cb, dict)):
            continue
        aa, ab = ca.get("args"), cb.get("args")
        if not (isinstance(aa, dict) and isinstance(ab, dict)):
            continue
        out = []
        for k in sorted(set(aa) | set(ab)):
            if k in CONFIG_IGNORED:
                continue
            if aa.get(k, "<unset>") != ab.get(k, "<unset>"):
                out.append((k, aa.get(k, "<unset>"), ab.get(k, "<unset>")))
        return out
    return []


def path_pairs(a: TraceRun, b: TraceRun) -> list[tuple[str, str]]:
    """(A's path, B's path) for the run-specific path flags: a body naming A's run directory or model is the same
    as one naming B's. The run directory also as the processes reached it (the trace header's runtime: the
    launcher resolves a relative --run-dir)."""
    for actor in a.actors():
        try:
            ma, mb = a.meta(actor), b.meta(actor)
        except KeyError:
            continue
        ca, cb = ma.get("config"), mb.get("config")
        if isinstance(ca, dict) and isinstance(cb, dict) and isinstance(ca.get("args"), dict) \
                and isinstance(cb.get("args"), dict):
            found = [(ca["args"].get(k), cb["args"].get(k)) for k in sorted(CONFIG_IGNORED)]
            ra, rb = ma.get("runtime"), mb.get("runtime")
            if isinstance(ra, dict) and isinstance(rb, dict):
                found.append((ra.get("run_dir"), rb.get("run_dir")))
            out = {(va, vb) for va, vb in found
                   if isinstance(va, str) and isinstance(vb, str) and va and vb and va != vb}
            return sorted(out, key=lambda p: (-len(p[0]), p))
    return []


def _same_paths(v: Any, pairs: list[tuple[str, str]]) -> Any:
    if not pairs:
        return v
    if isinstance(v, str):
        for old, new in pairs:
            if v == old or v.startswith(old.rstrip("/") + "/"):
                return new + v[len(old):]
        return v
    if isinstance(v, dict):
        return {k: _same_paths(x, pairs) for k, x in v.items()}
    if isinstance(v, list):
        return [_same_paths(x, pairs) for x in v]
    return v


def diff_runs(a: TraceRun, b: TraceRun, *, rtol: float = 1e-5, atol: float = 1e-8,
              ignore: frozenset = IGNORED_METHODS, ignore_inputs: frozenset = IGNORED_INPUTS
              ) -> tuple[list[Divergence], int]:
    """All differences (first one first) and how many message pairs were compared."""
    sa, sb = _streams(a, ignore), _streams(b, ignore)
    found: list[Divergence] = []
    compared = 0
    ia, ib = _input_streams(a, ignore_inputs), _input_streams(b, ignore_inputs)
    pairs = path_pairs(a, b)

    def fd(x, y):
        return first_difference(_same_paths(x, pairs), y, rtol=rtol, atol=atol, volatile=VOLATILE_DIFF)

    for key in set(ia) | set(ib):
        la, lb = ia.get(key, []), ib.get(key, [])
        for i in range(max(len(la), len(lb))):
            ea = la[i] if i < len(la) else None
            eb = lb[i] if i < len(lb) else None
            if ea is None or eb is None:
                found.append(Divergence(ea.t_ns if ea else None, eb.t_ns if eb else None, key,
                                        "only in A" if eb is None else "only in B", None, ea, eb))
                continue
            compared += 1
            d = fd(_safe_body(ea), _safe_body(eb))
            if d is not None:
                found.append(Divergence(ea.t_ns, eb.t_ns, key, "input", d, ea, eb))
    for key in set(sa) | set(sb):
        la, lb = sa.get(key, []), sb.get(key, [])
        for i in range(max(len(la), len(lb))):
            ma = la[i] if i < len(la) else None
            mb = lb[i] if i < len(lb) else None
            if ma is None or mb is None:
                found.append(Divergence(_t(ma) if ma else None, _t(mb) if mb else None, key,
                                        "only in A" if mb is None else "only in B", None, ma, mb))
                continue
            compared += 1
            d = fd(_request_body(ma), _request_body(mb))
            if d is not None:
                found.append(Divergence(_t(ma), _t(mb), key, "request", d, ma, mb))
                continue
            oa, ob = _outcome_class(ma), _outcome_class(mb)
            if oa != ob:
                found.append(Divergence(_t(ma), _t(mb), key, "outcome", Difference("outcome", outcome(ma),
                                                                                      outcome(mb)), ma, mb))
                continue
            if ma.header.get("kind") == "ask":
                d = fd(_reply_body(ma), _reply_body(mb))
                if d is not None:  # placed when the reply was sent: that is when the difference appeared
                    found.append(Divergence(_t_reply(ma), _t_reply(mb), key, "reply", d, ma, mb))
    ta0, tb0 = run_start_ns(a), run_start_ns(b)

    def when(dv: Divergence) -> float:
        # time since each run's start, A's clock first: a message only in B is placed by its time in B
        if dv.t_a is not None:
            return (dv.t_a - ta0) / 1e9
        return (dv.t_b - tb0) / 1e9

    found.sort(key=when)
    return found, compared


def _t_reply(m: Message) -> int:
    for e in (m.reply_sent, m.reply, m.handled):
        if e is not None:
            return e.t_ns
    return _t(m)


def _outcome_class(m: Message) -> str:
    o = outcome(m)
    return o.split(":", 1)[0]


def _describe_key(key: tuple) -> str:
    if len(key) == 4 and key[1] == "input":
        actor, _, name, k = key
        return f"{actor} input {name}" + (f" (key {k})" if k else "")
    frm, to, method, kind, ident = key
    fields = ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in ident)
    return f"{frm} -> {to} {kind} {method}" + (f" ({fields})" if fields else "")


def environment_note(a: TraceRun, b: TraceRun) -> str | None:
    """What differs between the environments the two runs' actors recorded (the floats' bits depend on them:
    slime_actors/recorder/environment.py), one line; None when nothing does or a run recorded none."""
    from ..recorder import environment
    from .reader import recorded_environment
    diffs: dict[str, tuple] = {}
    for actor in sorted(set(a.actors()) & set(b.actors())):
        fa = next((f for f in a.files if f.meta.get("actor") == actor), None)
        fb = next((f for f in b.files if f.meta.get("actor") == actor), None)
        ea, eb = recorded_environment(fa), recorded_environment(fb)
        if ea is None or eb is None:
            continue
        for k, x, y in environment.differences(ea, eb):
            diffs.setdefault(k, (k, x, y))
    if not diffs:
        return None
    return ("environments differ (floats may differ in their last bits for that alone): "
            + environment.describe(list(diffs.values())))


def render(a: TraceRun, b: TraceRun, *, rtol: float = 1e-5, atol: float = 1e-8, ignore: frozenset = IGNORED_METHODS,
           show: int = 5) -> tuple[str, bool]:
    """The report, and whether the runs diverged."""
    found, compared = diff_runs(a, b, rtol=rtol, atol=atol, ignore=ignore)
    found_msgs = [d for d in found if d.what != "input"]
    ta0, tb0 = run_start_ns(a), run_start_ns(b)
    lines = [f"A: {a.root} ({len(a.files)} trace files)", f"B: {b.root} ({len(b.files)} trace files)"]
    cfg = config_differences(a, b)
    if cfg:
        lines.append("config differs (so the runs are expected to part ways): "
                     + ", ".join(f"{k}: {va!r} -> {vb!r}" for k, va, vb in cfg[:20]))
    env = environment_note(a, b)
    if env:
        lines.append(env)
    only_a = sorted(set(a.actors()) - set(b.actors()))
    only_b = sorted(set(b.actors()) - set(a.actors()))
    if only_a or only_b:
        lines.append(f"actors only in A: {only_a or '-'}; only in B: {only_b or '-'}")
    if not found:
        lines.append(f"no divergence: {compared} message pairs agree (rtol={rtol}, atol={atol}; left out: "
                     f"{', '.join(sorted(ignore))}, and timing fields)")
        return "\n".join(lines), False
    def describe(dv: Divergence, head: str) -> None:
        where_a = rel(dv.t_a, ta0) if dv.t_a is not None else "-"
        where_b = rel(dv.t_b, tb0) if dv.t_b is not None else "-"
        lines.append(f"{head}: {_describe_key(dv.key)}  at {where_a} in A, {where_b} in B")
        if dv.what in ("only in A", "only in B"):
            m = dv.a or dv.b
            if isinstance(m, Event):
                lines.append(f"  this input is {dv.what}")
            else:
                lines.append(f"  this message is {dv.what}: its counterpart was never sent "
                             f"(id {m.id}; slime-actors trace chain {(a if dv.a else b).root} {m.id})")
        elif dv.what == "input":
            lines.append(f"  recorded input differs: {dv.diff}")
        else:
            lines.append(f"  {dv.what} {dv.diff}")
            lines.append(f"  A: id {dv.a.id}   B: id {dv.b.id}   (`slime-actors trace chain RUN ID` shows what led "
                         "to each)")

    lines.append("")
    describe(found[0], "first divergence")
    first_msg = next((d for d in found_msgs), None)
    if first_msg is not None and first_msg is not found[0]:
        describe(first_msg, "first message that differs")
    lines.append("")
    lines.append("first difference per actor (messages count for their sender, replies for the asker):")
    seen: set[str] = set()
    for dv in found:
        actor = dv.key[0]
        if actor in seen:
            continue
        seen.add(actor)
        when = rel(dv.t_a, ta0) if dv.t_a is not None else rel(dv.t_b, tb0) + " (B)"
        what = dv.what if dv.diff is None else f"{dv.what} {dv.diff}"
        lines.append(f"  {actor:<14} {when}  {_describe_key(dv.key)}: {what}"[:300])
    rest = [d for d in found[1:] if d is not first_msg][: max(0, show - 1)]
    if rest:
        lines.append("")
        lines.append("next differences in time order:")
        for dv in rest:
            when = rel(dv.t_a, ta0) if dv.t_a is not None else rel(dv.t_b, tb0) + " (B)"
            what = dv.what if dv.diff is None else f"{dv.what} {dv.diff}"
            lines.append(f"  {when}  {_describe_key(dv.key)}: {what}"[:300])
    lines.append("")
    lines.append(f"{len(found)} difference(s) among {compared} compared message pairs (rtol={rtol}, atol={atol})")
    return "\n".join(lines), True
