"""Orchestration overhead of the RL loop: per step, the share of wall time spent outside generation, reward
computation and the trainer's compute.

Runs the embedded default (`slime-actors train`, CPU, local engine, tiny model) for a few configurations, then reads
each run's traces and metrics:

    generation  union of the intervals in which at least one /generate request was in flight (rollout workers'
                recorded engine answers: request sent -> answer received)
    reward      union of the intervals in which a reward worker was running `score` (trace: handled records)
    train       the RL update's compute on trainer rank 0 (metrics time/train_compute: forward, backward, step)
    weight sync trainer/0's sync_weights (broadcast + the engines loading the weights)
    other       step wall time minus the union of generation and reward, minus train, minus weight sync: messages,
                scheduling, waiting for the slowest group, get_batch, mark_trained, ...

    .venv/bin/python bench/rl_overhead.py [--steps 20] [--keep]

Prints one table; the numbers in docs/performance.md came from it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "digits" / "config.toml"
sys.path.insert(0, str(ROOT))

from slime_actors.traces.summary import union_length  # noqa: E402

SMOLLM2 = ROOT / "examples" / "smollm2_arith" / "config.toml"
# name: (config, flags, steps or None for --steps). The tiny model's steps take ~0.1 s, so the loop's fixed cost per
# step (a few ms of messages between phases) shows; SmolLM2-135M (a real model, ~10 s a step on 2 CPUs) is what a
# step of real work looks like.
VARIANTS = {
    "digits (default)": (CONFIG, [], None),
    "longer responses": (CONFIG, ["--rollout-max-response-len", "16", "--n-samples-per-prompt", "16"], None),
    # (the example's job is sized for a GPU: the bench keeps the CPU-sized step it measured before)
    "SmolLM2-135M (real model)": (SMOLLM2, ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
                                            "--rollout-max-response-len", "12", "--global-batch-size", "16",
                                            "--micro-batch-size", "8", "--engine-max-batch-size", "64"], 6),
}


def analyse(run_dir: Path) -> list[dict]:
    from slime_actors.traces.reader import TraceRun
    run = TraceRun(run_dir)
    gen, rew = [], []
    for ev in run.events():
        if ev.ev == "input" and ev.name == "engine.generate":
            val = ev.body()
            if isinstance(val, dict) and "started" in val:
                gen.append((float(val["started"]), ev.t_ns / 1e9))
        elif ev.actor.startswith("reward/") and ev.method == "score" and ev.extra and "dur_ns" in ev.extra \
                and ev.ev in ("handled", "recv"):
            end = ev.t_ns / 1e9
            rew.append((end - ev.extra["dur_ns"] / 1e9, end))
    rows = []
    for m in (json.loads(line) for line in open(run_dir / "metrics.jsonl")):
        wall = m["time/step"]
        hi = m["time"]
        lo = hi - wall
        g = union_length(gen, lo, hi)
        gr = union_length(gen + rew, lo, hi)
        train = m.get("train/time/train_compute") or m.get("train/train_time") or 0.0
        sync = m.get("time/weight_sync", 0.0)
        rows.append({"step": m["rollout_id"], "wall": wall, "generation": g, "reward": gr - g, "train": train,
                     "sync": sync, "other": max(0.0, wall - gr - train - sync)})
    return rows


def controller_gaps(run_dir: Path) -> list[dict]:
    """Per step, the serial gaps of the synchronous loop that are the framework's own (ms; from the traces, each
    end as its sender recorded it):

        complete -> stats   the buffer's last accepted submit of the rollout -> its wait_rollout reply
        stats -> train      that reply -> the controller's train ask (rollout_done, end_rollout, ...)
        train -> batch      that ask -> the buffer's reply with trainer/0's shard: its get_batch, or the wait_batch
                            it asked ahead (0 when that reply went out before the train ask)
        trained -> sync     trainer/0's train reply -> the sync_weights ask (mark_trained, the rollout's reports)
        synced -> next      the sync_weights reply -> the next start_rollout ask (evaluate/save, the step's row)
    """
    from slime_actors.traces.reader import TraceRun
    run = TraceRun(run_dir)
    by: dict[tuple[str, int], object] = {}
    submits = []
    for m in run.messages().values():
        if m.method == "submit" and m.reply_sent is not None:
            submits.append(m.reply_sent.t_ns)
        if m.method in ("get_batch", "wait_batch") and m.send is not None and m.send.actor == "trainer/0":
            body = m.send.body()
            answered = m.method == "get_batch" or m.reply is not None and m.reply.body() is not None
            # (a shard pulled with get_batch: the one fetched ahead was set aside)
            if isinstance(body, dict) and answered and (m.method == "get_batch"
                                                        or ("get_batch", body.get("rollout_id")) not in by):
                by[("get_batch", body.get("rollout_id"))] = m
            continue
        if m.send is None or m.send.actor != "controller/0":
            continue
        body = m.send.body() if m.method in ("wait_rollout", "train", "sync_weights", "start_rollout") else None
        if not isinstance(body, dict) or body.get("kind", "train") != "train":
            continue
        if m.method == "start_rollout" and body.get("hold"):   # (rollout k+1 made ahead: the step starts at its open)
            continue
        if m.method == "train" and m.header.get("to") not in (None, "trainer/0"):
            continue
        if m.method == "sync_weights" and m.header.get("to") not in (None, "trainer/0"):
            continue
        k = body["weight_version"] - 1 if m.method == "sync_weights" else body.get("rollout_id")
        by[(m.method, k)] = m
    submits.sort()
    rows = []
    for (method, k), wait in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if method != "wait_rollout":
            continue
        train, sync, nxt = by.get(("train", k)), by.get(("sync_weights", k)), by.get(("start_rollout", k + 1))
        batch = by.get(("get_batch", k))
        if wait.reply_sent is None or train is None or sync is None or train.reply_sent is None or batch is None \
                or batch.reply_sent is None:
            continue
        done = max((t for t in submits if t <= wait.reply_sent.t_ns), default=wait.reply_sent.t_ns)
        row = {"step": k, "complete -> stats": (wait.reply_sent.t_ns - done) / 1e6,
               "stats -> train": (train.send.t_ns - wait.reply_sent.t_ns) / 1e6,
               "train -> batch": max(0, batch.reply_sent.t_ns - train.send.t_ns) / 1e6,
               "trained -> sync": (sync.send.t_ns - train.reply_sent.t_ns) / 1e6}
        if nxt is not None and sync.reply_sent is not None:
            row["synced -> next"] = (nxt.send.t_ns - sync.reply_sent.t_ns) / 1e6
        rows.append(row)
    return rows


def run_variant(name: str, config: Path, flags: list[str], steps: int, root: Path) -> list[dict]:
    run_dir = root / name.split()[0]
    cmd = [str(Path(sys.executable).parent / "slime-actors"), "train", "--config", str(config), "--run-dir",
           str(run_dir), "--num-rollout", str(steps), "--eval-interval", "0", "--skip-eval-before-train",
           "--progress", "false", *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"{name}: train failed:\n{p.stderr[-4000:]}")
    return analyse(run_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=2, help="leave out the first steps (warm-up)")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument("--only", default=None, help="comma list of variant names' first words (digits,longer,SmolLM2-135M)")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rl_overhead_"))
    load0 = os.getloadavg()[0]
    results = {}
    only = set(a.only.split(",")) if a.only else None
    for name, (config, flags, steps) in VARIANTS.items():
        if only is not None and name.split()[0] not in only:
            continue
        rows = run_variant(name, config, flags, steps or a.steps, root)[a.skip:]
        results[name] = rows
    load1 = os.getloadavg()[0]
    print(f"# RL loop orchestration overhead ({time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.node()}, "
          f"{os.cpu_count()} CPUs, load {load0:.1f}/{load1:.1f}; {a.steps} steps (SmolLM2: 6), first {a.skip} "
          f"left out)")
    print("command: .venv/bin/python bench/rl_overhead.py " + " ".join(sys.argv[1:]))
    print()
    print("| config | steps | step wall (ms, median) | generation | reward | train compute | weight sync | other "
          "(orchestration) | other, % of wall (median) | other incl. sync, % |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, rows in results.items():
        med = lambda k: statistics.median(r[k] for r in rows) * 1000  # noqa: E731
        share = statistics.median(r["other"] / r["wall"] for r in rows) * 100
        share_sync = statistics.median((r["other"] + r["sync"]) / r["wall"] for r in rows) * 100
        print(f"| {name} | {len(rows)} | {med('wall'):.0f} | {med('generation'):.0f} | {med('reward'):.0f} | {med('train'):.0f} | "
              f"{med('sync'):.0f} | {med('other'):.0f} | {share:.1f}% | {share_sync:.1f}% |")
    print("\ntarget: other <= 2% of step wall time")
    if not a.keep:
        import shutil
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"runs kept in {root}")


if __name__ == "__main__":
    main()
