"""The `slime-actors trace ...` and `slime-actors replay` commands (wired into slime_actors/cli.py).

    slime-actors trace summary  RUN [--step K] [--role R] [--method M] [--json]
    slime-actors trace show     RUN [--actor A] [--method M] [--kind K] [--since T] [--until T] [--step K]
                                    [--id ID] [--events E,..] [--drops] [--full] [--no-body] [--limit N] [--json]
    slime-actors trace chain    RUN MSG_ID [--bodies]
    slime-actors trace diff     RUN_A RUN_B [--rtol R] [--atol A] [--include-method M] [--all]
    slime-actors trace export   RUN -o run.json [--step K | --since T --until T] [--heartbeats] [--profiles]
    slime-actors trace timeline RUN --step K -o step.png
    slime-actors replay         RUN --actor ROLE/INDEX [--pid PID] [--set KEY=VALUE] [--path-map OLD=NEW] [--rtol R]
                                    [--json]

RUN is a run directory, its traces/ folder, or one .trace file. Times (--since/--until) are seconds from the run's
start, as `trace show` prints them (+12.5s), or Unix seconds. Exit codes: 0 fine (replay: bit-identical, or only
floats differ and all within --rtol/--atol; diff: no divergence), 1 a difference was found (replay: a logic
difference -- a message, a field that is not a float, an outcome), 2 bad input (a missing or corrupt trace file is
named with the byte offset and what was expected there), 3 replay: only floats differ, some beyond --rtol/--atol.
"""

from __future__ import annotations

import argparse
import json
import sys

EXIT_OK, EXIT_DIFFERENT, EXIT_BAD_INPUT, EXIT_FLOATS = 0, 1, 2, 3


def _err(msg: str) -> int:
    print(f"slime-actors: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _open(path: str, skip_bad: bool = False):
    from .reader import TraceRun
    run = TraceRun(path, skip_bad=skip_bad)
    for p in run.problems:
        print(f"note: {p}", file=sys.stderr)
    return run


def _guarded(fn):
    """Every trace command reports a bad trace, a bad question or a bad path as one clear line, never a traceback."""
    def run(args) -> int:
        from .query import QueryError
        from .reader import TraceFormatError
        from .replay import ReplayError
        try:
            return fn(args)
        except TraceFormatError as exc:
            return _err(f"bad trace file: {exc}")
        except (QueryError, ReplayError) as exc:
            return _err(str(exc))
        except BrokenPipeError:  # `| head`
            return EXIT_OK
        except OSError as exc:
            return _err(f"{exc.filename or ''}: {exc.strerror or exc}")
    return run


def _window(run, args) -> tuple[int | None, int | None, str]:
    from .query import parse_time, rel, run_start_ns, step_window
    t0 = run_start_ns(run)
    if getattr(args, "step", None) is not None:
        st = step_window(run, args.step)
        return st.start_ns, st.end_ns, f"; step {args.step}: {rel(st.start_ns, t0)} .. {rel(st.end_ns, t0)}"
    since, until = parse_time(getattr(args, "since", None), t0), parse_time(getattr(args, "until", None), t0)
    label = ""
    if since is not None or until is not None:
        label = f"; window {rel(since, t0) if since else 'start'} .. {rel(until, t0) if until else 'end'}"
    return since, until, label


def _split(values) -> list[str]:
    out = []
    for v in values or ():
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


# --------------------------------------------------------------------------------------------------- commands
def cmd_summary(args) -> int:
    from .summary import as_json, render, reply_waits, summarize
    run = _open(args.run, args.skip_bad)
    since, until, label = _window(run, args)
    roles, methods = set(_split(args.role)) or None, set(_split(args.method)) or None
    rows = summarize(run, since=since, until=until, roles=roles, methods=methods)
    if args.json:
        print(json.dumps(as_json(rows), indent=1))
    else:
        waits = reply_waits(run, since=since, until=until, roles=roles, methods=methods)
        print(render(run, rows=rows, title=label, loop_waits=waits))
    return EXIT_OK


def cmd_show(args) -> int:
    from .query import _safe_body, event_line, render_value, run_start_ns, select_events
    run = _open(args.run, args.skip_bad)
    since, until, label = _window(run, args)
    events = _split(args.events)
    if args.drops:
        events = ["drop"]
    kinds = _split(args.kind)
    evs = select_events(run, actor=args.actor, methods=_split(args.method), kinds=kinds, events=events,
                        since=since, until=until, msg_id=args.id)
    if "hb" not in kinds:
        evs = [e for e in evs if not (e.header and e.header.get("kind") == "hb")]
    t0 = run_start_ns(run)
    total = len(evs)
    if args.limit and total > args.limit:
        evs = evs[: args.limit]
    if args.json:
        for e in evs:
            rec = {"t": (e.t_ns - t0) / 1e9, "actor": e.actor, "event": e.ev, "header": e.header,
                   "extra": e.extra, "size": e.body_size}
            if not args.no_body:
                body = _safe_body(e)
                if _split(args.fields) and isinstance(body, dict):
                    body = {k: body[k] for k in _split(args.fields) if k in body}
                rec["body"] = json.loads(render_value(body, 0))
            print(json.dumps(rec))
        return EXIT_OK
    print(f"run {run.root}: {total} record(s)" + label
          + (f", the first {len(evs)} shown (--limit)" if len(evs) < total else ""))
    width = 0 if args.full else args.max_chars
    fields = _split(args.fields)
    for e in evs:
        print(event_line(e, t0))
        if args.no_body or e.ev == "handled" or e.ev == "drop":
            continue
        if e.body_raw is None and not e.body_size:
            continue
        body = e.body()
        if fields and isinstance(body, dict):
            body = {k: body[k] for k in fields if k in body}
        print("    " + render_value(body, width))
    return EXIT_OK


def cmd_chain(args) -> int:
    from .query import ancestors, descendants, describe, find_message, render_value, run_start_ns
    run = _open(args.run, args.skip_bad)
    msgs = run.messages()
    m, note = find_message(run, args.msg_id, msgs)
    t0 = run_start_ns(run)
    up = ancestors(m, msgs)
    down = descendants(m, msgs, limit=args.limit)
    in_trace = sum(1 for x in msgs.values() if x.header.get("trace") == m.header.get("trace"))
    print(f"trace {m.header.get('trace')}: {in_trace} message(s) in it" + (f"  ({note})" if note else ""))

    def body_of(x):
        e = x.send or x.recv
        return render_value(e.body(), args.max_chars) if e is not None else ""

    print("caused by:" if up else "caused by: nothing (sent outside any handler: the start of its trace)")
    for i, x in enumerate(up):
        print("  " + "  " * i + describe(x, t0))
        if args.bodies:
            print("  " + "  " * i + "    " + body_of(x))
    print("this message:")
    print("  >> " + describe(m, t0))
    print("     body: " + body_of(m))
    reply = m.reply or m.reply_sent
    if reply is not None:
        print("     reply: " + render_value(reply.body(), args.max_chars))
    print(f"caused ({len(down)} message(s)" + (", cut at --limit" if len(down) >= args.limit else "") + "):"
          if down else "caused: nothing")
    for node in down:
        print("  " + "  " * node.depth + describe(node.message, t0))
        if args.bodies:
            print("  " + "  " * node.depth + "    " + body_of(node.message))
    return EXIT_OK


def cmd_diff(args) -> int:
    from .diff import IGNORED_METHODS, render
    a = _open(args.run_a, args.skip_bad)
    b = _open(args.run_b, args.skip_bad)
    ignore = frozenset() if args.all else IGNORED_METHODS - set(_split(args.include_method))
    text, diverged = render(a, b, rtol=args.rtol, atol=args.atol, ignore=ignore, show=args.show)
    print(text)
    return EXIT_DIFFERENT if diverged else EXIT_OK


def cmd_export(args) -> int:
    from .export import export
    run = _open(args.run, args.skip_bad)
    since, until, label = _window(run, args)
    data = export(run, args.output, heartbeats=args.heartbeats, since=since, until=until, profiles=args.profiles)
    ev = data["traceEvents"]
    n_slices = sum(1 for e in ev if e["ph"] == "X" and not str(e.get("cat", "")).startswith("profile."))
    n_flows = sum(1 for e in ev if e["ph"] == "s")
    other = data["otherData"]
    profs = other.get("profiles") or []
    extra = ""
    if profs:
        n_prof = sum(1 for e in ev if str(e.get("cat", "")).startswith("profile."))
        extra = (f", {len(profs)} profile(s) merged ({n_prof} profiler events; clocks aligned by "
                 f"{', '.join(sorted({p['aligned_by'] for p in profs}))})")
    for n in other.get("profile_notes") or ():
        print(f"note: {n}", file=sys.stderr)
    print(f"wrote {args.output}: {len(other['actors'])} actor track(s), {n_slices} slices, "
          f"{n_flows} message arrows{label}{extra}; open it in https://ui.perfetto.dev")
    return EXIT_OK


def cmd_timeline(args) -> int:
    from .timeline import render_step, render_window
    run = _open(args.run, args.skip_bad)
    if args.step is None:
        from .query import run_end_ns, run_start_ns
        since, until, _ = _window(run, args)
        info = render_window(run, since or run_start_ns(run), until or run_end_ns(run), args.output,
                             title="window", arrows=not args.no_arrows)
    else:
        info = render_step(run, args.step, args.output, arrows=not args.no_arrows)
    print(f"wrote {info['path']}: {info['seconds']:.3f} s, {info['messages']} handled message(s), "
          f"{len(info['actors'])} actors")
    return EXIT_OK


def cmd_replay(args) -> int:
    from ..log import setup_logging
    from .replay import parse_path_maps, parse_sets, replay
    setup_logging(level="info" if args.verbose else "error")  # the replayed actor's own log lines
    run = _open(args.run, args.skip_bad)
    if "/" not in args.actor:
        return _err(f"--actor {args.actor!r}: expected ROLE/INDEX, e.g. reward/0 (actors: {', '.join(run.actors())})")
    report = replay(run, args.actor, pid=args.pid, overrides=parse_sets(args.set),
                    path_map=parse_path_maps(args.path_map), rtol=args.rtol, atol=args.atol, timeout=args.timeout,
                    allow_network=args.allow_network)
    if args.json:
        fl = report.floats
        print(json.dumps({"actor": report.actor, "verdict": report.verdict, "identical": report.identical,
                          "within_tolerance": report.within_tolerance, "stopped": report.stopped,
                          "counts": report.counts, "notes": report.notes, "steps": report.steps,
                          "floats": {"values": fl.values, "messages": fl.messages, "beyond_tolerance": fl.beyond,
                                     "max_rel": fl.max_rel, "max_at": _plain(fl.max_at),
                                     "arrays_by_checksum": fl.arrays_by_checksum},
                          "environment": None if report.environment is None else
                          [{"key": k, "recorded": _plain(a), "here": _plain(b)} for k, a, b in report.environment],
                          "cut": report.cut,
                          "differences": [{"t": (f.t_ns - report.t0) / 1e9, "what": f.what, "kind": f.kind,
                                           "message": f.message,
                                           "recorded_id": f.rec_id, "answers": f.answers,
                                           "field": f.diff.path if f.diff else None,
                                           "recorded": _plain(f.diff.a) if f.diff else None,
                                           "replayed": _plain(f.diff.b) if f.diff else None}
                                          for f in report.findings]}, indent=1, default=str))
    else:
        print(report.render(show=args.show))
    if report.stopped:
        return EXIT_BAD_INPUT
    if report.verdict == "floats":
        return EXIT_OK if report.within_tolerance else EXIT_FLOATS
    return EXIT_OK if report.identical else EXIT_DIFFERENT


def _plain(v):
    from .query import _jsonable
    return _jsonable(v)


# --------------------------------------------------------------------------------------------------- parsers
def add_trace_commands(sub) -> None:
    """`slime-actors trace ...` under the top-level subparsers `sub`."""
    t = sub.add_parser("trace", help="read a run's traces: summary, show, chain, diff, export, timeline",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tsub = t.add_subparsers(dest="trace_cmd", required=True)

    def common(p, run=True):
        if run:
            p.add_argument("run", help="run directory (or its traces/ folder, or one .trace file)")
        p.add_argument("--skip-bad", action="store_true", help="leave out unreadable trace files (named on stderr)")

    def window(p, step_help="only step K (from the controller's start_rollout(K) to the end of its training)"):
        p.add_argument("--step", type=int, default=None, help=step_help)
        p.add_argument("--since", default=None, help="seconds from the run's start (or Unix seconds)")
        p.add_argument("--until", default=None, help="seconds from the run's start (or Unix seconds)")

    s = tsub.add_parser("summary", help="per role and method: counts, bytes, latency percentiles, errors")
    common(s)
    window(s)
    s.add_argument("--role", action="append", help="only messages to these roles (repeat or comma-separate)")
    s.add_argument("--method", action="append", help="only these methods")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=_guarded(cmd_summary))

    s = tsub.add_parser("show", help="messages with their bodies decoded")
    common(s)
    s.add_argument("--actor", default=None, help="records in this actor's trace file (all it sent, received, "
                                                 "handled and its inputs)")
    s.add_argument("--method", action="append", help="only these methods (input names for inputs)")
    s.add_argument("--kind", action="append", help="tell, ask, reply, error, hb (hb only when asked for)")
    s.add_argument("--events", action="append", help="send, recv, handled, input, drop (default: all; without "
                                                     "--actor a message between two traced actors shows once)")
    s.add_argument("--drops", action="store_true", help="only messages dropped as undecodable")
    s.add_argument("--id", default=None, help="only this message (id prefix) and its reply")
    window(s)
    s.add_argument("--limit", type=int, default=0, help="at most N records")
    s.add_argument("--full", action="store_true", help="whole bodies (default: cut at --max-chars)")
    s.add_argument("--max-chars", type=int, default=400)
    s.add_argument("--no-body", action="store_true")
    s.add_argument("--fields", action="append", help="only these top-level fields of each body (comma-separate)")
    s.add_argument("--json", action="store_true", help="one JSON object per record")
    s.set_defaults(fn=_guarded(cmd_show))

    s = tsub.add_parser("chain", help="what led to a message and what it caused")
    common(s)
    s.add_argument("msg_id", help="message id (16 hex digits, or a unique prefix); a reply's id names its ask")
    s.add_argument("--bodies", action="store_true", help="bodies of every message in the chain")
    s.add_argument("--max-chars", type=int, default=300)
    s.add_argument("--limit", type=int, default=500, help="at most N caused messages")
    s.set_defaults(fn=_guarded(cmd_chain))

    s = tsub.add_parser("diff", help="first divergence between two runs of the same config")
    s.add_argument("run_a")
    s.add_argument("run_b")
    common(s, run=False)
    s.add_argument("--rtol", type=float, default=1e-5)
    s.add_argument("--atol", type=float, default=1e-8)
    s.add_argument("--include-method", action="append", help="compare this polling/plumbing method too")
    s.add_argument("--all", action="store_true", help="compare every method")
    s.add_argument("--show", type=int, default=5, help="differences listed")
    s.set_defaults(fn=_guarded(cmd_diff))

    s = tsub.add_parser("export", help="Chrome/Perfetto trace-event JSON (open in ui.perfetto.dev)")
    common(s)
    s.add_argument("-o", "--output", required=True)
    window(s)
    s.add_argument("--heartbeats", action="store_true", help="include heartbeats")
    s.add_argument("--profiles", action=argparse.BooleanOptionalAction, default=None,
                   help="merge RUN/profiles (torch profiler traces: --use-pytorch-profiler) onto the actors' tracks, "
                        "clocks aligned (default: when there are any)")
    s.set_defaults(fn=_guarded(cmd_export))

    s = tsub.add_parser("timeline", help="a PNG of one step: actors x time, handlers as bars, messages as arrows")
    common(s)
    s.add_argument("-o", "--output", required=True)
    window(s, step_help="the step to draw (or give --since/--until)")
    s.add_argument("--no-arrows", action="store_true")
    s.set_defaults(fn=_guarded(cmd_timeline))


def add_replay_command(sub) -> None:
    r = sub.add_parser("replay", help="run one actor again against its recorded messages; report the first "
                                      "difference", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("run", help="run directory (or its traces/ folder)")
    r.add_argument("--actor", required=True, help="ROLE/INDEX, e.g. reward/0, buffer/0, trainer/0")
    r.add_argument("--pid", type=int, default=None, help="which trace file when the actor was restarted")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change a recorded job flag first (VALUE as JSON, else a string): what if...?")
    r.add_argument("--path-map", action="append", default=[], metavar="OLD=NEW",
                   help="read recorded paths starting with OLD under NEW (a run recorded elsewhere)")
    r.add_argument("--rtol", type=float, default=None, help="float tolerance for the exit code (default 0; trainer 1e-4); any float that differs at all is reported")
    r.add_argument("--atol", type=float, default=None, help="(default 0; trainer 1e-6)")
    r.add_argument("--timeout", type=float, default=600.0, help="real seconds before giving up")
    r.add_argument("--allow-network", action="store_true", help="let the actor open connections (not replayed)")
    r.add_argument("--show", type=int, default=5, help="differences listed")
    r.add_argument("--json", action="store_true")
    r.add_argument("-v", "--verbose", action="store_true", help="the replayed actor's info log lines too")
    r.add_argument("--skip-bad", action="store_true")
    r.set_defaults(fn=_guarded(cmd_replay))
