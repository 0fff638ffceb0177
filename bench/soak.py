"""A long run of a job, watching every process for growth: resident memory, open files, threads and trace bytes.

    python bench/soak.py --minutes 60                       # the default job (examples/digits) for an hour
    python bench/soak.py --minutes 20 --out runs/soak       # shorter; the table, samples and plot under --out
    python bench/soak.py --config my_job.toml --minutes 600 -- --rollout-batch-size 32   # another job, its flags

It starts `slime-actors train` with --num-rollout large enough not to end on its own, samples every --every seconds
each process of the job (the head -- controller, directory, agent --, the buffer, rollout workers, reward workers,
trainer ranks, and each rollout worker's engine), stops the job after --minutes (SIGTERM: a clean stop, as Ctrl-C),
then prints one table:

    process  metric  start  end  slope per 1,000 steps

`start` and `end` are the first and last sample after the warm-up (the first --warmup share of the steps: imports,
first allocations), the slope a least-squares fit over those samples against the job's step count. Memory and
thread counts that keep growing with steps show as a slope well above zero; trace bytes grow by construction (the
slope is the bytes a process writes per 1,000 steps, bounded by --trace-max-bytes). It writes OUT/samples.jsonl,
OUT/table.md and OUT/soak.png (one panel per metric, a line per process, against steps).

Read /proc only (Linux). The numbers of one hour on the reference machine are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("rss_mib", "open_files", "threads", "trace_mib")


def proc_stats(pid: int) -> dict | None:
    """RSS (MiB), open file descriptors and threads of a process, from /proc; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    out = {"open_files": fds}
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            out["rss_mib"] = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            out["threads"] = int(line.split()[1])
    return out


def children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    except OSError:
        pass
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def job_processes(run_dir: Path) -> dict[str, int]:
    """name -> pid: the job's processes from RUN/status.json (actors sharing a process are named together: the
    head), and each process's engine child (`engine:rollout/0`)."""
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    by_pid: dict[int, list[str]] = {}
    for name, a in (status.get("actors") or {}).items():
        if isinstance(a, dict) and a.get("pid"):
            by_pid.setdefault(int(a["pid"]), []).append(name)
    out = {"+".join(sorted(names)): pid for pid, names in by_pid.items()}
    for name, pid in list(out.items()):
        for c in children(pid):
            if "local_engine" in cmdline(c) or "sglang" in cmdline(c):
                out[f"engine:{name}"] = c
    return out


def trace_bytes(run_dir: Path, pid: int) -> float:
    """MiB of trace files a process wrote that are still on disk (its segments after rotations included)."""
    total = 0
    for f in (run_dir / "traces").glob(f"*.{pid}*.trace"):
        try:
            total += f.stat().st_size
        except OSError:
            pass
    return total / 2**20


def steps_of(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / "status.json").read_text())["controller"]["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fit(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs (0 with fewer than 2 distinct xs)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def table(samples: list[dict], warmup: float) -> list[tuple]:
    """(process, metric, start, end, slope per 1,000 steps, samples) after the warm-up."""
    last = max((s["step"] for s in samples), default=0)
    keep = [s for s in samples if s["step"] >= warmup * last]
    rows = []
    names = sorted({n for s in keep for n in s["procs"]})
    for name in names:
        for m in METRICS:
            pts = [(s["step"], s["procs"][name][m]) for s in keep if name in s["procs"] and m in s["procs"][name]]
            if not pts:
                continue
            rows.append((name, m, pts[0][1], pts[-1][1], 1000 * fit([p[0] for p in pts], [p[1] for p in pts]),
                         len(pts)))
    return rows


def render(rows: list[tuple], head: str) -> str:
    lines = [head, "", "| process | metric | start | end | slope per 1,000 steps |", "|---|---|---|---|---|"]
    for name, m, a, b, slope, _ in rows:
        lines.append(f"| {name} | {m} | {a:.1f} | {b:.1f} | {slope:+.3f} |")
    return "\n".join(lines)


def plot(samples: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(METRICS), 1, figsize=(9, 2.6 * len(METRICS)), sharex=True)
    names = sorted({n for s in samples for n in s["procs"]})
    colors = {n: f"C{i}" for i, n in enumerate(names)}  # one colour per process in every panel
    for ax, m in zip(axes, METRICS):
        for name in names:
            pts = [(s["step"], s["procs"][name][m]) for s in samples if name in s["procs"] and m in s["procs"][name]]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, lw=1, color=colors[name])
        ax.set_ylabel(m)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    axes[-1].set_xlabel("training step")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="examples/digits/config.toml")
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=0.1, help="share of the steps left out of the table")
    p.add_argument("--out", default="runs/soak")
    p.add_argument("extra", nargs="*", help="more flags for the job (after --)")
    a = p.parse_args(argv)
    out = Path(a.out).resolve()
    run_dir = out / "run"
    out.mkdir(parents=True, exist_ok=True)
    bin_ = Path(sys.executable).parent / "slime-actors"
    cmd = [str(bin_), "train", "--config", a.config, "--run-dir", str(run_dir), "--num-rollout", "10000000",
           "--progress", "false", "--use-tensorboard", "false", "--log-level", "warning", *a.extra]
    log = open(out / "job.log", "w")
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    samples: list[dict] = []
    t0 = time.monotonic()
    deadline = t0 + a.minutes * 60
    print(f"soak: {' '.join(cmd)}\n  for {a.minutes:g} min, a sample every {a.every:g} s -> {out}", flush=True)
    with open(out / "samples.jsonl", "w") as fh:
        while time.monotonic() < deadline and job.poll() is None:
            time.sleep(a.every)
            step = steps_of(run_dir)
            if step is None:
                continue
            procs = {}
            for name, pid in job_processes(run_dir).items():
                st = proc_stats(pid)
                if st is None:
                    continue
                if not name.startswith("engine:"):
                    st["trace_mib"] = trace_bytes(run_dir, pid)
                procs[name] = st
            s = {"t": round(time.monotonic() - t0, 1), "step": step, "procs": procs}
            samples.append(s)
            fh.write(json.dumps(s) + "\n")
            fh.flush()
            if len(samples) % 30 == 0:
                print(f"  {s['t']:.0f} s, step {step}", flush=True)
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGTERM)
        try:
            job.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
    if not samples:
        print(f"no samples: the job did not get going (see {out / 'job.log'})", file=sys.stderr)
        return 1
    steps = samples[-1]["step"]
    minutes = samples[-1]["t"] / 60
    head = (f"soak of `{' '.join(['slime-actors', 'train', '--config', a.config, *a.extra])}`: {minutes:.1f} min, "
            f"{steps} steps ({steps / max(minutes, 1e-9):.0f} a minute), {len(samples)} samples; table after the "
            f"first {a.warmup:.0%} of the steps")
    text = render(table(samples, a.warmup), head)
    (out / "table.md").write_text(text + "\n")
    print(text)
    try:
        plot(samples, out / "soak.png")
        print(f"plot: {out / 'soak.png'}")
    except ImportError:
        print("(matplotlib not installed: no plot)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
