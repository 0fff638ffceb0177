"""Garbage-collection pauses in a running job, with and without freezing start-up's objects, side by side in one run.

    .venv/bin/python bench/gc_pauses.py [--steps 40] [--rounds 2] [--warn-ms 10] [--config examples/digits/config.toml]

Each round runs the job (`slime-actors train --config CONFIG --num-rollout STEPS`) twice, in a rotating order: with
SLIME_ACTORS_GC_FREEZE=1 (the default: each actor process collects once and calls gc.freeze() when it has started;
slime_actors/gc_watch.py) and with SLIME_ACTORS_GC_FREEZE=0. SLIME_ACTORS_GC_WARN_MS=WARN_MS makes every process log
each collection of WARN_MS or more; the table counts those after the process started (the logs' "long garbage
collection" events without during="start-up"), per actor, and the job's step times (metrics.jsonl `time/step`, the
first two steps left out).

Prints a Markdown table (docs/performance.md has the numbers and the command).
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
sys.path.insert(0, str(ROOT))
from bench.cmdline import command_line  # noqa: E402


def run_job(config: Path, run_dir: Path, steps: int, freeze: bool, warn_ms: float) -> dict:
    env = {**os.environ, "SLIME_ACTORS_GC_FREEZE": "1" if freeze else "0", "SLIME_ACTORS_GC_WARN_MS": str(warn_ms)}
    cmd = [sys.executable, "-m", "slime_actors.cli", "train", "--config", str(config), "--num-rollout", str(steps),
           "--run-dir", str(run_dir), "--progress", "false"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"gc_pauses: the job failed (exit {p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}")
    pauses: dict[str, list[float]] = {}
    for log in sorted((run_dir / "logs").glob("*.jsonl")):
        for line in log.read_text(errors="replace").splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "long garbage collection" and ev.get("during") != "start-up":
                pauses.setdefault(str(ev.get("actor", log.stem)), []).append(float(ev["ms"]))
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps_s = [float(r["time/step"]) for r in rows if "time/step" in r][2:]
    return {"pauses": pauses, "steps": steps_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "digits" / "config.toml")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warn-ms", type=float, default=10.0, help="collections this long or longer are counted")
    a = ap.parse_args(argv)
    if a.steps < 4 or a.rounds < 1 or a.warn_ms <= 0:
        ap.error("--steps must be at least 4, --rounds at least 1, --warn-ms above 0")
    results: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="gc_pauses_") as tmp:
        for r in range(a.rounds):
            for freeze in ((True, False) if r % 2 == 0 else (False, True)):
                t0 = time.time()
                res = run_job(a.config, Path(tmp) / f"{'frozen' if freeze else 'plain'}-{r}", a.steps, freeze,
                              a.warn_ms)
                results[freeze].append(res)
                print(f"[gc_pauses] round {r + 1}, freeze {int(freeze)}: {time.time() - t0:.0f} s", file=sys.stderr)
    print(f"# garbage-collection pauses ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
          f"{os.cpu_count()} CPUs; {a.rounds} rounds of {a.steps} steps, collections of {a.warn_ms:g} ms or more "
          f"after start)")
    print(f"command: {command_line()}\n")
    print("| start-up's objects | round | step median (ms) | step max (ms) | collections >= threshold after start, "
          "per actor: count (longest ms) | their sum (ms) |")
    print("|---|---:|---:|---:|---|---:|")
    for freeze in (True, False):
        for r, res in enumerate(results[freeze], 1):
            per = ", ".join(f"{actor} {len(v)} ({max(v):.0f})" for actor, v in sorted(res["pauses"].items())) or "none"
            total = sum(sum(v) for v in res["pauses"].values())
            st = res["steps"]
            print(f"| {'frozen (default)' if freeze else 'not frozen'} | {r} | {1000 * statistics.median(st):.0f} | "
                  f"{1000 * max(st):.0f} | {per} | {total:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
