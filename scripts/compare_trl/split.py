"""Where one of our training steps goes, from the run's traces (RUN/traces) and metrics (RUN/metrics.jsonl).

    rows = step_split("runs/compare_trl/ours-local")     # one dict per step, seconds
    rows[0] == {"step": 1, "wall": ..., "generation": ..., "reward": ..., "training": ..., "weight_update": ...,
                "messaging": ..., "idle": ..., "orchestration": ..., "source": "traces"}

A step's window is the controller's step (metrics `time/step`, ending at the row's `time`) less its held-out
evaluation and checkpoints, which come after the weight update. Inside it, each moment goes to the first of these
that covers it (so the parts add up to the window exactly):

    generation     a /generate request in flight (the rollout worker's recorded engine answers: sent -> answered)
    reward         a reward worker running `score`
    training       the trainer's RL update (rank 0: the last `train/time/train_compute` seconds of its `train`):
                   reference and old log-probs, forward, backward, optimizer step
    weight_update  the controller's `sync_weights` ask, sent -> answered (the trainer hands the engines the weights)
    messaging      any other message between actors in flight or being handled -- the buffer's start_rollout,
                   get_work, submit, get_batch (the trainer fetching its batch), mark_trained, pauses, end_rollout,
                   and the legs in transit of the long asks (a handler that only waits for other work is not counted)
    idle           none of these

orchestration = everything that is not generation, training or the weight update (reward + messaging + idle).

Without traces (a run with --trace false) the split comes from the metrics alone (source "metrics"): generation and
reward together as `time/rollout`, training `train/time/train_compute`, weight update `time/weight_sync`, and the
rest of the window as messaging + idle.
"""

from __future__ import annotations

import json
from pathlib import Path

from slime_actors.traces.summary import union_length

PARTS = ("generation", "reward", "training", "weight_update", "messaging", "idle")
# asks whose handler waits for other work (counted elsewhere or waiting by design): only their transit counts
WAITING = frozenset(("wait_rollout", "wait_batch", "get_work", "train", "sync_weights", "score",
                     "update_weights_from_distributed", "update_weights_from_ipc", "update_weights_from_tensor", "update_weights_from_disk",
                     "init_weights_group", "rollback"))
PLUMBING = frozenset(("register", "watch", "deregister", "lookup", "heartbeat", "list", "_peer_down"))


class SplitError(ValueError):
    """The run has nothing to split (no metrics): the message says what is missing."""


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise SplitError(f"{path}: no such file (is {run_dir} a slime-actors run directory?)")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line of a killed run
        if isinstance(row, dict) and isinstance(row.get("rollout_id"), int):
            rows.append(row)
    return rows


def step_window(row: dict) -> tuple[float, float]:
    """(start, end) in Unix seconds of a metrics row's step without its evaluation and checkpoints."""
    wall = float(row.get("time/step") or 0.0)
    end = float(row["time"])
    start = end - wall
    after = sum(float(row.get(k) or 0.0) for k in ("time/eval", "time/save", "time/save_hf"))
    return start, max(start, end - after)


def trace_intervals(run_dir: str | Path) -> dict[str, list[tuple[float, float]]]:
    """Intervals (Unix seconds) of each kind of work, read from the run's traces."""
    from slime_actors.traces.reader import TraceRun
    run = TraceRun(run_dir, skip_bad=True)
    out: dict[str, list] = {"generation": [], "reward": [], "train_handler": [], "weight_update": [], "messaging": [],
                            "labeled": [], "tail": []}
    for f in run.files:
        for ev in f.events:
            if ev.ev == "input" and ev.name == "engine.generate":
                try:
                    val = ev.body()
                except Exception:
                    continue
                if isinstance(val, dict) and isinstance(val.get("started"), (int, float)):
                    out["generation"].append((float(val["started"]), ev.t_ns / 1e9))
    for m in run.messages().values():
        kind = m.header.get("kind")
        if kind not in ("tell", "ask") or m.method in PLUMBING:
            continue
        to = str(m.header.get("to", ""))
        if m.method == "score" and to.startswith("reward/") and m.recv is not None and m.handled is not None:
            out["reward"].append((m.recv.t_ns / 1e9, m.handled.t_ns / 1e9))
        if m.method == "train" and to == "trainer/0" and m.recv is not None and m.handled is not None:
            out["train_handler"].append((m.recv.t_ns / 1e9, m.handled.t_ns / 1e9))
        if m.method == "sync_weights" and to == "trainer/0" and m.send is not None and m.reply is not None:
            out["weight_update"].append((m.send.t_ns / 1e9, m.reply.t_ns / 1e9))
        if m.method in TAIL_METHODS:
            out["tail"].append((m.method, to, *(None if e is None else e.t_ns / 1e9
                                                for e in (m.send, m.recv, m.handled, m.reply))))
        label = f"{to.split('/')[0]}.{m.method}"
        if m.method in WAITING:  # only the legs in transit
            if m.send is not None and m.recv is not None:
                out["messaging"].append((m.send.t_ns / 1e9, m.recv.t_ns / 1e9))
                out["labeled"].append((m.send.t_ns / 1e9, m.recv.t_ns / 1e9, label + " (ask in transit)"))
            if m.reply_sent is not None and m.reply is not None:
                out["messaging"].append((m.reply_sent.t_ns / 1e9, m.reply.t_ns / 1e9))
                out["labeled"].append((m.reply_sent.t_ns / 1e9, m.reply.t_ns / 1e9, label + " (reply in transit)"))
            continue
        first = m.send or m.recv
        last = [e for e in (m.reply, m.reply_sent, m.handled, m.recv) if e is not None]
        if first is not None and last:
            out["messaging"].append((first.t_ns / 1e9, max(e.t_ns for e in last) / 1e9))
            out["labeled"].append((first.t_ns / 1e9, max(e.t_ns for e in last) / 1e9, label))
    return out


# the end of a rollout, from its last generation to the trainer's update (`rollout_tail`): key, what it is
TAIL = (("scored", "the last group scored (its `score` handled)"),
        ("handed_in", "the last group handed in (its `submit` handled by the buffer)"),
        ("reported", "the rollout's end reported to the controller (`wait_rollout`'s reply there)"),
        ("train_arrived", "the controller's `train` at the trainer"),
        ("update_started", "the trainer's update starts (its batch at hand)"))
TAIL_METHODS = frozenset(("score", "submit", "wait_rollout", "train"))


def rollout_tail(run_dir: str | Path, rows: list[dict] | None = None,
                 iv: dict[str, list] | None = None) -> dict[str, float]:
    """The end of each step's rollout on the critical path, mean seconds after its last generation ended (TAIL's
    keys, in order): when the last group was scored and handed in, when the controller heard the rollout was
    complete, when its `train` reached the trainer, and when the trainer's update started. Steps that lack one of
    them (no traces of it) are left out; {} when none has them all."""
    rows = read_metrics(run_dir) if rows is None else rows
    iv = trace_intervals(run_dir) if iv is None else iv
    per: dict[str, list[float]] = {k: [] for k, _ in TAIL}
    for row in rows:
        lo, hi = step_window(row)
        ends = [b for a, b in iv["generation"] if lo < b <= hi]
        if not ends:
            continue
        g = max(ends)
        tail = iv["tail"]
        reported = [r for m, to, s, rc, h, r in tail if m == "wait_rollout" and r is not None and g <= r <= hi]
        trains = [(rc, h) for m, to, s, rc, h, r in tail
                  if m == "train" and to == "trainer/0" and rc is not None and h is not None and g <= rc <= hi]
        if not reported or not trains:
            continue
        rep = min(reported)
        scored = [h for m, to, s, rc, h, r in tail
                  if m == "score" and to.startswith("reward/") and h is not None and lo < h <= rep]
        handed = [h for m, to, s, rc, h, r in tail if m == "submit" and h is not None and lo < h <= rep]
        if not scored or not handed:
            continue
        arrived, handled = min(trains)
        compute = float(row.get("train/time/train_compute") or 0.0)
        for k, t in (("scored", max(scored)), ("handed_in", max(handed)), ("reported", rep),
                     ("train_arrived", arrived), ("update_started", handled - compute)):
            per[k].append(t - g)
    n = len(per["scored"])   # (each step adds to every key or to none)
    return {k: sum(per[k]) / n for k, _ in TAIL} if n else {}


REWARD_LABEL = "reward.score (scoring)"
TRAIN_WAIT_LABEL = "trainer.train (its arrival to its update: the batch fetched)"


def orchestration_by_message(run_dir: str | Path, rows: list[dict] | None = None,
                             iv: dict[str, list] | None = None) -> dict[str, float]:
    """Where the orchestration of our steps goes, mean seconds per step by message: each moment of a step's window
    that no generation, training or weight update covers goes to the scoring that covers it, else to the message
    that covers it (the one that started first; a long ask that only waits, by its legs in transit; the trainer's
    `train` between its arrival and its update's start), else to "idle". The values add up to the mean
    orchestration of `step_split`."""
    rows = read_metrics(run_dir) if rows is None else rows
    iv = trace_intervals(run_dir) if iv is None else iv
    total: dict[str, float] = {}
    for row in rows:
        lo, hi = step_window(row)
        compute = float(row.get("train/time/train_compute") or 0.0)
        work = iv["generation"] + iv["weight_update"] + [
            (max(a, b - compute), b) for a, b in iv["train_handler"] if b > lo and a < hi]
        labeled = [(a, b, REWARD_LABEL) for a, b in iv["reward"]] + \
            [(a, max(a, b - compute), TRAIN_WAIT_LABEL) for a, b in iv["train_handler"]] + \
            sorted(iv["labeled"])
        work = [x for x in work if x[1] > lo and x[0] < hi]
        labeled = [x for x in labeled if x[1] > lo and x[0] < hi]
        cuts = sorted({lo, hi, *(min(max(t, lo), hi) for x in work + labeled for t in x[:2])})
        for a, b in zip(cuts, cuts[1:]):
            if b <= a:
                continue
            mid = (a + b) / 2
            if any(x0 <= mid < x1 for x0, x1 in work):
                continue
            label = next((lab for x0, x1, lab in labeled if x0 <= mid < x1), "idle")
            total[label] = total.get(label, 0.0) + (b - a)
    n = max(1, len(rows))
    return dict(sorted(((k, v / n) for k, v in total.items()), key=lambda kv: -kv[1]))


def _split_row(row: dict, iv: dict[str, list[tuple[float, float]]]) -> dict:
    lo, hi = step_window(row)
    compute = float(row.get("train/time/train_compute") or 0.0)
    train_iv = [(max(a, b - compute), b) for a, b in iv["train_handler"] if b > lo and a < hi]
    layers = [("generation", iv["generation"]), ("reward", iv["reward"]), ("training", train_iv),
              ("weight_update", iv["weight_update"]), ("messaging", iv["messaging"])]
    out: dict = {"step": row["rollout_id"] + 1, "wall": hi - lo}
    acc: list[tuple[float, float]] = []
    prev = 0.0
    for name, ivs in layers:
        acc = acc + ivs
        now = union_length(acc, lo, hi)
        out[name] = now - prev
        prev = now
    out["idle"] = max(0.0, (hi - lo) - prev)
    out["orchestration"] = out["reward"] + out["messaging"] + out["idle"]
    out["source"] = "traces"
    return out


def _split_metrics_only(row: dict) -> dict:
    lo, hi = step_window(row)
    wall = hi - lo
    gen = float(row.get("time/rollout") or 0.0)
    train = float(row.get("train/time/train_compute") or 0.0)
    sync = float(row.get("time/weight_sync") or 0.0)
    rest = max(0.0, wall - gen - train - sync)
    return {"step": row["rollout_id"] + 1, "wall": wall, "generation": gen, "reward": None, "training": train,
            "weight_update": sync, "messaging": None, "idle": None, "messaging+idle": rest,
            "orchestration": rest, "source": "metrics"}


def step_split(run_dir: str | Path, rows: list[dict] | None = None) -> tuple[list[dict], list[str]]:
    """(one split per step, notes). Traces are read when there are any; otherwise the metrics alone."""
    rows = read_metrics(run_dir) if rows is None else rows
    if not rows:
        raise SplitError(f"{run_dir}: metrics.jsonl has no step (the run ended before its first step?)")
    notes: list[str] = []
    traces = Path(run_dir) / "traces"
    if traces.is_dir() and any(traces.glob("*.trace*")):
        try:
            iv = trace_intervals(run_dir)
            return [_split_row(r, iv) for r in rows], notes
        except Exception as exc:  # unreadable traces: say so, and split by the metrics
            notes.append(f"traces unreadable ({type(exc).__name__}: {exc}); split from the metrics alone")
    else:
        notes.append(f"no traces in {traces}; split from the metrics alone (generation and reward together)")
    return [_split_metrics_only(r) for r in rows], notes


def eval_before_first_step(run_dir: str | Path, rows: list[dict]) -> float | None:
    """Seconds the held-out evaluation before the first step took (the controller asks the buffer for eval rollout
    0, then starts step 0), from the traces; None without them."""
    if not rows:
        return None
    try:
        from slime_actors.traces.reader import TraceRun
        run = TraceRun(run_dir, skip_bad=True)
    except Exception:
        return None
    start0 = step_window(rows[0])[0]
    first = None
    for f in run.files:
        if not str(f.meta.get("actor", "")).startswith("controller/"):
            continue
        for ev in f.events:
            if ev.ev != "send" or ev.method != "start_rollout":
                continue
            try:
                body = ev.body()
            except Exception:
                continue
            if isinstance(body, dict) and body.get("kind") == "eval" and isinstance(body.get("rollout_id"), int) \
                    and body["rollout_id"] < 1000 and ev.t_ns / 1e9 <= start0:
                t = ev.t_ns / 1e9
                first = t if first is None else min(first, t)
    return None if first is None else max(0.0, start0 - first)
