"""Samples in front of the user: what the model said, what it got for it.

A rising reward is not learning until someone reads the responses. This module is the `slime-actors samples`
command: it reads a finished run's samples back (saved rollouts, saved held-out evaluations, or the buffer's trace)
and shows them (the picking and formatting the run itself uses while it trains are in sample_display.py):

    slime-actors samples RUN                          # the last rollout: the first --n samples
    slime-actors samples RUN --rollout 3 --worst --n 5
    slime-actors samples RUN --eval [--step 20]       # held-out responses (greedy) of an evaluation
    slime-actors samples RUN --report                 # markdown: held-out accuracy, before/after table, ten samples

Where samples come from: rollouts saved with --save-debug-rollout-data (the run's job.json names the place, or
give --data), else the buffer's trace (every group a rollout worker submitted, while its message body was within
the trace body limit, SLIME_ACTORS_TRACE_BODY_LIMIT). Held-out evaluations: RUN/evals/<name>_step<K>.jsonl
(written by the controller after every evaluation), else the buffer's trace.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .types import Sample

from .sample_display import EVAL_DIR, markdown_cell, one_line, prompt_text, reward_text
from .json_files import parse_json, read_small_json


# ------------------------------------------------------------------------------------------------ reading a run
class SamplesError(ValueError):
    """A run without samples to show, or a bad argument; the message says which and where it looked."""


@dataclass
class RunSamples:
    rollouts: dict[int, list[Sample]] = field(default_factory=dict)    # train rollout id -> samples
    evals: dict[tuple[str, int], list[dict]] = field(default_factory=dict)   # (set name, step) -> result rows
    source: str = ""
    notes: list[str] = field(default_factory=list)


def _job(run: Path) -> dict:
    return read_small_json(run / "job.json") or {}


def load_saved_rollouts(spec: str, num_rollout: int | None = None) -> dict[int, list[Sample]]:
    """Rollouts written by --save-debug-rollout-data SPEC (one msgpack file per rollout id)."""
    import msgpack

    from .config import debug_rollout_path
    out: dict[int, list[Sample]] = {}
    paths: dict[int, Path] = {}
    if num_rollout:
        for k in range(num_rollout):
            p = debug_rollout_path(spec, k)
            if p.exists():
                paths[k] = p
    if not paths:   # the files that are there, whatever the run's length
        probe = debug_rollout_path(spec, 123456789)
        pattern = re.escape(probe.name).replace("123456789", r"0*(\d+)")
        if probe.parent.is_dir():
            for p in probe.parent.iterdir():
                m = re.fullmatch(pattern, p.name)
                if m:
                    paths[int(m.group(1))] = p
    for k, p in sorted(paths.items()):
        try:
            data = msgpack.unpackb(p.read_bytes(), raw=False, strict_map_key=False)
            out[k] = [Sample.from_wire(s) for s in data["samples"]]
        except Exception as exc:
            raise SamplesError(f"{p} is not a saved rollout ({type(exc).__name__}: {exc}); expected what "
                               "--save-debug-rollout-data writes") from None
    return out


def load_eval_files(run: Path) -> dict[tuple[str, int], list[dict]]:
    out = {}
    d = run / EVAL_DIR
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*_step*.jsonl")):
        m = re.fullmatch(r"(.+)_step(\d+)\.jsonl", p.name)
        if not m:
            continue
        rows = []
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(parse_json(line))
                except ValueError:
                    raise SamplesError(f"{p}:{i}: not a JSON line") from None
        rows.sort(key=lambda r: r.get("index", 0) if isinstance(r, dict) else 0)   # prompt order
        out[(m.group(1), int(m.group(2)))] = rows
    return out


def load_from_traces(run: Path) -> tuple[dict[int, list[Sample]], dict[tuple[str, int], list[dict]], list[str]]:
    """Samples the buffer received (its `submit` requests), from its trace files: train rollouts by id, and
    evaluations by (name, step) -- the controller numbers an evaluation after step K as K * 1000 + its index."""
    from .traces.reader import TraceRun
    tdir = run / "traces" if (run / "traces").is_dir() else run
    files = sorted([*tdir.glob("buffer-0.*.trace"), *tdir.glob("buffer-0.*.trace.gz")])
    notes: list[str] = []
    if not files:
        return {}, {}, [f"no buffer trace in {tdir}"]
    train: dict[int, dict[int, Sample]] = {}
    evals: dict[int, dict[int, Sample]] = {}
    omitted = 0
    for f in files:
        tr = TraceRun(f, skip_bad=True)
        notes += tr.problems
        for ev in tr.events():
            if ev.ev != "recv" or ev.method != "submit":
                continue
            if ev.omitted:
                omitted += 1
                continue
            body = ev.body()
            if not isinstance(body, dict):
                continue
            kind = "eval" if str(body.get("work_id", "")).startswith("eval-") else "train"
            for raw in body.get("samples") or []:
                try:
                    s = Sample.from_wire(raw)
                except (TypeError, ValueError):
                    continue
                (evals if kind == "eval" else train).setdefault(s.rollout_id, {})[s.index] = s
    if omitted:
        notes.append(f"{omitted} submitted group(s) were over the trace body limit and could not be read (raise "
                     "SLIME_ACTORS_TRACE_BODY_LIMIT, or save rollouts with --save-debug-rollout-data)")
    rollouts = {k: sorted(v.values(), key=lambda s: s.index) for k, v in train.items()}
    # the trace does not name an evaluation's set: the sets of one step, in the order they ran, are eval, eval1, ...
    by_step: dict[int, list[int]] = {}
    for eid in sorted(evals):
        by_step.setdefault(eid // 1000, []).append(eid)
    ev_rows = {}
    for step, eids in by_step.items():
        for i, eid in enumerate(eids):
            rows = [{"index": s.index, "prompt": s.prompt, "response": s.response, "reward": s.reward,
                     "label": s.label} for s in sorted(evals[eid].values(), key=lambda s: s.index)]
            ev_rows[("eval" if i == 0 else f"eval{i}", step)] = rows
    return rollouts, ev_rows, notes


def load_run(run: str | Path, data: str | None = None, need: str = "rollouts") -> RunSamples:
    """A run's samples. `need` is "rollouts" or "evals": the traces are read only when the files lack them."""
    run = Path(run)
    if not run.exists():
        raise SamplesError(f"{run}: no such run directory")
    job = _job(run)
    out = RunSamples()
    spec = data or job.get("save_debug_rollout_data")
    if spec:
        out.rollouts = load_saved_rollouts(spec, job.get("num_rollout"))
        if out.rollouts:
            out.source = f"saved rollouts ({spec})"
        elif data:
            raise SamplesError(f"--data {data}: no saved rollout there")
    out.evals = load_eval_files(run)
    if (need == "rollouts" and not out.rollouts) or (need == "evals" and not out.evals):
        try:
            rollouts, evals, notes = load_from_traces(run)
        except Exception as exc:   # a trace that cannot be read: say so, with what was looked for
            rollouts, evals, notes = {}, {}, [f"traces unreadable: {exc}"]
        out.notes += notes
        if need == "rollouts" and rollouts:
            out.rollouts, out.source = rollouts, "the buffer's trace"
        if need == "evals" and evals:
            out.evals = evals
            out.source = "the buffer's trace"
    elif need == "evals":
        out.source = f"{run / EVAL_DIR}"
    return out


# ------------------------------------------------------------------------------------------------ report
def _acc(rows: list[dict]) -> float | None:
    rs = [float(r["reward"]) for r in rows if r.get("reward") is not None]
    return sum(rs) / len(rs) if rs else None


def report_markdown(run: str | Path, n_table: int = 10, n_samples: int = 10, seed: int = 0,
                    name: str | None = None) -> str:
    """Markdown for a results page: held-out accuracy at every evaluation, a before/after table of held-out
    responses (the first evaluation against the last), and `n_samples` held-out responses after training,
    picked with a seeded RNG."""
    rs = load_run(run, need="evals")
    if not rs.evals:
        raise SamplesError(f"{run}: no held-out evaluation saved (no {Path(run) / EVAL_DIR}/*.jsonl) and none in "
                           "the traces; " + "; ".join(rs.notes))
    names = sorted({n for n, _ in rs.evals})
    name = name or names[0]
    if name not in names:
        raise SamplesError(f"no evaluation set {name!r} in {run} (sets: {', '.join(names)})")
    steps = sorted(s for n, s in rs.evals if n == name)
    first, last = rs.evals[(name, steps[0])], rs.evals[(name, steps[-1])]
    out = [f"Held-out set `{name}`: {len(first)} prompts, greedy (temperature 0); samples from {rs.source}.", ""]
    out += ["| step | held-out accuracy |", "|---|---|"]
    out += [f"| {s} | {_acc(rs.evals[(name, s)]):.3f} |" for s in steps]
    key = lambda r: (json.dumps(r.get("prompt"), sort_keys=True), json.dumps(r.get("label"), sort_keys=True))  # noqa: E731
    after = {key(r): r for r in last}
    pairs = [(b, after[key(b)]) for b in first if key(b) in after]
    fixed = sum(1 for b, a in pairs if (b.get("reward") or 0) < (a.get("reward") or 0))
    broken = sum(1 for b, a in pairs if (b.get("reward") or 0) > (a.get("reward") or 0))
    out += ["", f"Step {steps[0]} -> step {steps[-1]}: {fixed} prompts went from wrong to right, {broken} from right "
            f"to wrong, of {len(pairs)}.", ""]
    out += [f"| # | prompt | label | step {steps[0]} response | reward | step {steps[-1]} response | reward |",
            "|---|---|---|---|---|---|---|"]
    for i, (b, a) in enumerate(pairs[:n_table], 1):
        out.append(f"| {i} | {markdown_cell(prompt_text(b.get('prompt', '')), 160)} | {markdown_cell(b.get('label'), 30)} | "
                   f"{markdown_cell(b.get('response', ''), 300)} | {reward_text(b.get('reward')).strip()} | "
                   f"{markdown_cell(a.get('response', ''), 300)} | {reward_text(a.get('reward')).strip()} |")
    picks = random.Random(seed).sample(range(len(last)), min(n_samples, len(last)))
    out += ["", f"{len(picks)} held-out responses at step {steps[-1]} (picked with seed {seed}):", ""]
    for i, j in enumerate(sorted(picks), 1):
        r = last[j]
        out.append(f"{i}. **{markdown_cell(prompt_text(r.get('prompt', '')), 300)}** (label {markdown_cell(r.get('label'), 30)}, "
                   f"reward {reward_text(r.get('reward')).strip()})<br>{markdown_cell(r.get('response', ''), 1200)}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------ the command
def cmd_samples(args) -> int:
    try:
        return _cmd_samples(args)
    except SamplesError as exc:
        print(f"slime-actors samples: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


def _cmd_samples(args) -> int:
    if args.n < 1:
        raise SamplesError(f"--n must be >= 1, got {args.n}")
    if args.report:
        sys.stdout.write(report_markdown(args.run, n_table=args.n if args.n_given else 10, name=args.set))
        return 0
    if args.eval:
        rs = load_run(args.run, need="evals")
        for note in rs.notes:
            print(f"note: {note}", file=sys.stderr)
        if not rs.evals:
            raise SamplesError(f"{args.run}: no held-out evaluation saved and none in the traces")
        keys = sorted(rs.evals)
        if args.set:
            keys = [k for k in keys if k[0] == args.set]
            if not keys:
                sets = ", ".join(sorted({k[0] for k in rs.evals}))
                raise SamplesError(f"no evaluation set {args.set!r} (sets: {sets})")
        if args.step is not None:
            keys = [k for k in keys if k[1] == args.step]
            if not keys:
                raise SamplesError(f"no evaluation at step {args.step} (steps: "
                                   f"{', '.join(str(s) for s in sorted({k[1] for k in rs.evals}))})")
        name, step = keys[-1]
        rows = rs.evals[(name, step)]
        print(f"held-out [{name}] at step {step}: accuracy {_acc(rows):.3f} over {len(rows)} prompts ({rs.source})")
        rows = _order(rows, args, lambda r: r.get("reward"))
        for r in rows[: args.n]:
            _print_one(r.get("prompt", ""), r.get("label"), r.get("reward"), r.get("response", ""), args.width)
        return 0
    rs = load_run(args.run, data=args.data)
    for note in rs.notes:
        print(f"note: {note}", file=sys.stderr)
    if not rs.rollouts:
        raise SamplesError(f"{args.run}: no saved rollout (--save-debug-rollout-data) and no readable submission "
                           "in the buffer's trace")
    k = max(rs.rollouts) if args.rollout is None else args.rollout
    if k not in rs.rollouts:
        have = sorted(rs.rollouts)
        raise SamplesError(f"no rollout {k} in {rs.source} (rollouts: {_ranges(have)})")
    samples = rs.rollouts[k]
    rewards = [s.reward for s in samples if s.reward is not None]
    mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "none"
    print(f"rollout {k}: {len(samples)} samples, reward mean {mean} ({rs.source})")
    for s in _order(samples, args, lambda s: s.reward)[: args.n]:
        _print_one(s.prompt, s.label, s.reward, s.response, args.width,
                   extra=f"sample {s.index}, group {s.group_index}, {len(s.response_tokens)} tokens"
                   + ("" if s.finish_reason in (None, "stop") else f", {s.finish_reason}"))
    return 0


def _order(items: list, args, reward):
    if args.best or args.worst:
        keyed = sorted(enumerate(items), key=lambda t: (-(reward(t[1]) if reward(t[1]) is not None else float("-inf"))
                                                        if args.best else
                                                        (reward(t[1]) if reward(t[1]) is not None else float("inf")),
                                                        t[0]))
        return [x for _, x in keyed]
    return list(items)


def _print_one(prompt, label, reward, response, width: int, extra: str = "") -> None:
    print(f"--- reward {reward_text(reward).strip()}  label {one_line(label, 60)}" + (f"  ({extra})" if extra else ""))
    print(f"prompt:   {one_line(prompt_text(prompt), width)}")
    text = str(response).rstrip()
    print("response: " + (text.replace("\n", "\n          ") if width <= 0 else one_line(text, width * 4)))


def _ranges(ks: list[int]) -> str:
    if not ks:
        return "none"
    out, start, prev = [], ks[0], ks[0]
    for k in ks[1:] + [None]:
        if k is not None and k == prev + 1:
            prev = k
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if k is not None:
            start = prev = k
    return ", ".join(out)


def add_samples_command(sub) -> None:
    p = sub.add_parser("samples", help="print a run's samples: prompts, responses, rewards",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="run directory")
    p.add_argument("--rollout", type=int, default=None, help="train rollout id (default: the last one found)")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--best", action="store_true", help="the highest rewards first")
    order.add_argument("--worst", action="store_true", help="the lowest rewards first")
    p.add_argument("--n", type=int, default=None, help="how many samples (default 8; --report: table rows, 10)")
    p.add_argument("--data", default=None, help="saved rollouts (--save-debug-rollout-data's value), if job.json "
                                                "does not name them")
    p.add_argument("--eval", action="store_true", help="held-out evaluation responses instead of a rollout")
    p.add_argument("--step", type=int, default=None, help="with --eval: the evaluation after this step (default: "
                                                          "the last)")
    p.add_argument("--set", default=None, help="with --eval/--report: the evaluation set's name")
    p.add_argument("--report", action="store_true", help="markdown: held-out accuracy per evaluation, a "
                                                         "before/after table, ten responses after training")
    p.add_argument("--width", type=int, default=160, help="characters per line (0: responses in full)")
    p.set_defaults(fn=_with_defaults)


def _with_defaults(args) -> int:
    args.n_given = args.n is not None
    if args.n is None:
        args.n = 8
    return cmd_samples(args)
