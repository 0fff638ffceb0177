"""The runs of scripts/speed_gpu_ab.sh side by side: one markdown table, a column per run (the other tree's and this
one's, in the order they ran), from each run's summary.json (scripts/compare_trl/report.py) and the replies' waits
read from its traces (waits_<run>.json: `--waits`, which the script runs after each run, before the next one
replaces the run's folder).

    python -m scripts.compare_trl.ab OUT                      # OUT: speed_gpu_ab.sh's folder: r1_old/, r2_new/, ...
    python -m scripts.compare_trl.ab --waits RUN_DIR FILE     # a run's waits (slime_actors/traces/summary.reply_waits)

Rows: samples/s, the median step, our orchestration per step (mean ms, its share of the step by the mean and by the
median step), the end of a rollout (split.rollout_tail: ms after the last generation), the largest parts of the
orchestration by message, the replies' waits for the rollout worker's loop (its `reward.score` and `buffer.submit`
asks: p50 / p95 / max ms), held-out accuracy at the last evaluation, the time to the first step and the GPU's peak
memory. A run without a summary (it failed: its log is OUT/rN_tree.log) gets dashes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .split import TAIL

RUN_DIR = re.compile(r"r(\d+)_(old|new)")
WAITS = (("rollout/0", "reward.score"), ("rollout/0", "buffer.submit"))


def runs(out: Path) -> list[tuple[int, str, Path]]:
    """(number, "old" | "new", its folder), in the order they ran."""
    found = []
    for p in out.iterdir():
        m = RUN_DIR.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), m.group(2), p))
    return sorted(found)


def record_waits(run_dir: str | Path, out: str | Path) -> dict:
    """The run's replies' waits for their askers' loops (`reply_waits`, what `trace summary` prints) as JSON in `out`:
    {"asker role.method": {"n", "p50", "p95", "max"}} (ms). Returns it."""
    from slime_actors.traces.reader import TraceRun
    from slime_actors.traces.summary import percentile, reply_waits
    got = {f"{asker} {ask}": {"n": len(ms), "p50": percentile(ms, 50), "p95": percentile(ms, 95), "max": max(ms)}
           for (asker, ask), ms in reply_waits(TraceRun(str(run_dir), skip_bad=True)).items() if ms}
    Path(out).write_text(json.dumps(got, indent=1))
    return got


def _ours(summary: dict) -> tuple[str, dict] | None:
    for name, run in summary.get("runs", {}).items():
        if run.get("framework") == "ours":
            return name, run.get("metrics", {})
    return None


def column(folder: Path) -> dict[str, str]:
    """One run's cells, by row name."""
    cells: dict[str, str] = {}
    path = folder / "compare" / "summary.json"
    if not path.is_file():
        return cells
    try:
        summary = json.loads(path.read_text())
    except ValueError:      # (a run killed while its report was written: that column gets dashes)
        return cells
    got = _ours(summary) if isinstance(summary, dict) else None
    if got is None:
        return cells
    name, m = got

    def f(v, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)
    cells["run"] = name
    cells["samples/s"] = f(m.get("samples_per_s"), ".1f")
    cells["step, median s"] = f(m.get("step_median_s"), ".3f")
    mean, share = m.get("split_mean_s", {}), m.get("split_share", {})
    if "orchestration" in mean:
        median = m.get("orchestration_share_median")
        cells["orchestration, ms a step (mean % / median step %)"] = (
            f"{1e3 * mean['orchestration']:.1f} ({100 * share.get('orchestration', 0.0):.2f} / "
            f"{f(None if median is None else 100 * median, '.2f')})")
    tail = m.get("rollout_tail_s", {})
    for key, label in TAIL:
        if key in tail:
            cells[f"after the last generation: {label}, ms"] = f"{1e3 * tail[key]:.2f}"
    by = sorted(m.get("orchestration_by_message_s", {}).items(), key=lambda kv: -kv[1])[:3]
    if by:
        cells["largest orchestration parts, ms a step"] = "; ".join(f"{k} {1e3 * v:.2f}" for k, v in by)
    try:
        w = json.loads((folder / f"waits_{name}.json").read_text())
    except (OSError, ValueError):
        w = {}
    for asker, ask in WAITS:
        got = w.get(f"{asker} {ask}") if isinstance(w, dict) else None
        if isinstance(got, dict):
            cells[f"{asker}'s {ask} replies waiting for its loop, ms (p50 / p95 / max)"] = \
                f"{got['p50']:.2f} / {got['p95']:.2f} / {got['max']:.2f}"
    cells["held-out at the last evaluation"] = f(m.get("acc_equal_steps"), ".3f")
    cells["time to first step, s"] = f(m.get("time_to_first_step_s"), ".1f")
    cells["peak GPU memory, GiB"] = f(m.get("peak_mem_gib"), ".1f")
    return cells


def table(out: Path) -> str:
    found = runs(out)
    if not found:
        raise SystemExit(f"{out}: no run folders (r1_old, r2_new, ...): is it scripts/speed_gpu_ab.sh's OUT?")
    cols = [column(p) for _, _, p in found]
    rows: list[str] = []
    for c in cols:
        rows += [k for k in c if k not in rows and k != "run"]
    head = [f"{n}: {which}" for n, which, _ in found]
    lines = ["| | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    if not rows:
        lines.append("| (no run left a summary: see the runs' logs) |" + " - |" * len(head))
    for r in rows:
        lines.append(f"| {r} | " + " | ".join(c.get(r, "-") for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="scripts/speed_gpu_ab.sh's OUT folder (with --waits: the JSON file to write)")
    ap.add_argument("--waits", metavar="RUN_DIR", help="write the waits of this run's traces (its directory, or its "
                                                       "traces/ folder) to OUT")
    a = ap.parse_args(argv)
    if a.waits:
        from slime_actors.traces.reader import TraceFormatError
        try:
            record_waits(a.waits, a.out)
        except TraceFormatError as exc:
            ap.error(f"--waits: {exc}")
        return 0
    out = Path(a.out)
    if not out.is_dir():
        ap.error(f"{out}: no such folder")
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
