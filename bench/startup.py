"""Time to the first step of `make train`'s job, before and after a change, side by side in one run.

    .venv/bin/python bench/startup.py [--before REF] [--rounds 3] [--steps 1]

Each round runs, in a rotating order: a bare `python -c "import torch, transformers"` (the floor: what any PyTorch
program on this machine pays), the one-step digits job (`slime-actors train --config examples/digits/config.toml
--num-rollout 1`) on the code of REF (default: main; extracted with `git archive` into a temporary directory and
put first on PYTHONPATH, so the same virtual environment runs it), and the same job on this working tree. For each
job: the wall time of the whole command, the time from its launch to the end of its first step (the first row of
metrics.jsonl, less the evaluation after it), CPU seconds and peak memory per process (user + system time; PSS,
which shares a page among the processes that map it, and RSS; from /proc) and the job's own start-up breakdown
(RUN_DIR/startup.json). Ratios to the bare import are taken per round (the machine's load moves between rounds)
and their median is shown.

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

from scripts.compare_trl.proctree import ProcTree  # noqa: E402

CONFIG = ROOT / "examples" / "digits" / "config.toml"


def extract(ref: str, dest: Path) -> Path:
    """The tree of `ref` (git archive) in dest; its C extension is not built there (the pure-Python trace writer
    is used instead: ~0.3 µs a message, nothing at this scale)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run_job(tree: Path | None, run_dir: Path, steps: int, extra: list[str]) -> dict:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                           if p])
    cmd = [sys.executable, "-m", "slime_actors.cli", "train", "--config", str(CONFIG), "--num-rollout", str(steps),
           "--run-dir", str(run_dir), "--progress", "false", *extra]
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=tree or ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pt = ProcTree(p.pid, interval=0.2).start()
    out, _ = p.communicate()
    wall = time.time() - t0
    pt.stop()
    if p.returncode != 0:
        raise SystemExit(f"job failed ({' '.join(cmd)}):\n{out[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    first = rows[0]
    first_end = float(first["time"]) - float(first.get("time/eval", 0.0))
    summary = pt.summary()
    startup = run_dir / "startup.json"   # the job's own breakdown (slime_actors/startup_timeline.py)
    return {"wall": wall, "first_step": first_end - t0, "cpu": {r["name"]: r["cpu_s"] for r in summary["roles"]},
            "mem": {r["name"]: (r["peak_pss_mib"], r["peak_rss_mib"]) for r in summary["roles"]},
            "peak_pss_mib": summary["peak_pss_mib"],
            "startup": json.loads(startup.read_text()) if startup.is_file() else None}


def run_bare() -> dict:
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import torch, transformers"], check=True)
    return {"wall": time.time() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="main", help="git ref of the 'before' code (default: main)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1, help="--num-rollout of the job")
    ap.add_argument("--extra", default="", help="more `slime-actors train` flags for both jobs (one string)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="startup_bench_"))
    before = extract(a.before, work / "before")
    rev = subprocess.run(["git", "rev-parse", "--short", a.before], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip())
    # the built-in model both jobs use is made once, here: each job finds it beside its run directory (RUN_DIR/../
    # .models) instead of the first job of the first round paying for it
    import tomllib

    from slime_actors.models.resolve import model_cache, resolve_checkpoint
    resolve_checkpoint(tomllib.loads(CONFIG.read_text())["hf_checkpoint"], model_cache(work / "run"))
    modes = ["bare", "before", "after"]
    res: dict[str, list[dict]] = {m: [] for m in modes}
    load0 = os.getloadavg()
    for r in range(a.rounds):
        order = modes[r % 3:] + modes[:r % 3]
        for m in order:
            if m == "bare":
                res[m].append(run_bare())
            else:
                res[m].append(run_job(before if m == "before" else None, work / f"{m}-{r}", a.steps,
                                      a.extra.split()))
            print(f"round {r} {m}: {res[m][-1]['wall']:.1f} s", file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    med = statistics.median
    print(f"# time to the first step ({time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.node()}, {os.cpu_count()} "
          f"CPUs, load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; {a.rounds} rounds)")
    print(f"command: {command_line()}")
    print(f"before: {a.before} ({rev}); after: this tree ({head}{', with uncommitted changes' if dirty else ''})")
    print()
    print("| | wall (s) | x bare import | time to first step end (s) | x bare import | peak PSS (MiB) |")
    print("|---|---:|---:|---:|---:|---:|")
    bare = [x["wall"] for x in res["bare"]]
    print(f"| `python -c \"import torch, transformers\"` | {med(bare):.2f} | 1.00 | | | |")
    for m in ("before", "after"):
        rows = res[m]
        print(f"| one-step digits job, {m} | {med(x['wall'] for x in rows):.2f} | "
              f"{med(x['wall'] / b for x, b in zip(rows, bare)):.2f} | {med(x['first_step'] for x in rows):.2f} | "
              f"{med(x['first_step'] / b for x, b in zip(rows, bare)):.2f} | "
              f"{med(x['peak_pss_mib'] for x in rows):.0f} |")
    print()
    names = sorted({n for m in ("before", "after") for x in res[m] for n in x["cpu"]})
    print("| CPU seconds (median) | " + " | ".join(names) + " | all |")
    print("|---|" + "---:|" * (len(names) + 1))
    for m in ("before", "after"):
        cells = [med(x["cpu"].get(n, 0.0) for x in res[m]) for n in names]
        print(f"| {m} | " + " | ".join(f"{c:.1f}" for c in cells)
              + f" | {med(sum(x['cpu'].values()) for x in res[m]):.1f} |")
    print()
    print("| peak memory per process, MiB (median): PSS / RSS | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for m in ("before", "after"):
        cells = [(med(x["mem"].get(n, (0.0, 0.0))[0] for x in res[m]), med(x["mem"].get(n, (0.0, 0.0))[1]
                                                                            for x in res[m])) for n in names]
        print(f"| {m} | " + " | ".join(f"{p:.0f} / {r:.0f}" for p, r in cells) + " |")
    from slime_actors.startup_timeline import format_breakdown
    print()
    print("Each job's start-up breakdown (RUN_DIR/startup.json, as the job prints it), round by round:")
    print()
    print("```")
    for r in range(a.rounds):
        for m in ("before", "after"):
            b = res[m][r]["startup"]
            print(f"round {r}, {m}:")
            print("\n".join(format_breakdown(b)) if b else "  (no startup.json: the code predates it)")
    print("```")


if __name__ == "__main__":
    main()
