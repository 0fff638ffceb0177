"""The runs of scripts/speed_gpu_ab.sh side by side: one markdown table, a column per run (the other tree's and this
one's, in the order they ran), from each run's summary.json (scripts/compare_trl/report.py) and `slime-actors trace
summary` text.

    python -m scripts.compare_trl.ab OUT            # OUT: speed_gpu_ab.sh's folder, holding r1_old/, r2_new/, ...

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
# a line of `trace summary`'s "replies waiting for their asker's event loop" (slime_actors/traces/summary.py)
WAIT = re.compile(r"^\s+(\S+)\s+(\S+)\s+n=(\d+)\s+p50\s+([\d.]+)\s+p95\s+([\d.]+)\s+max\s+([\d.]+)\s*$")
WAITS = (("rollout/0", "reward.score"), ("rollout/0", "buffer.submit"))


def runs(out: Path) -> list[tuple[int, str, Path]]:
    """(number, "old" | "new", its folder), in the order they ran."""
    found = []
    for p in out.iterdir():
        m = RUN_DIR.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), m.group(2), p))
    return sorted(found)


def waits(text: str) -> dict[tuple[str, str], tuple[int, float, float, float]]:
    """(asker, "role.method") -> (n, p50, p95, max) from `trace summary`'s text."""
    out = {}
    for line in text.splitlines():
        m = WAIT.match(line)
        if m:
            out[(m.group(1), m.group(2))] = (int(m.group(3)), float(m.group(4)), float(m.group(5)),
                                             float(m.group(6)))
    return out


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
    text = folder / f"trace_summary_{name}.txt"
    if text.is_file():
        w = waits(text.read_text())
        for asker, ask in WAITS:
            if (asker, ask) in w:
                n, p50, p95, top = w[(asker, ask)]
                cells[f"{asker}'s {ask} replies waiting for its loop, ms (p50 / p95 / max)"] = \
                    f"{p50:.2f} / {p95:.2f} / {top:.2f}"
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
    ap.add_argument("out", help="scripts/speed_gpu_ab.sh's OUT folder")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if not out.is_dir():
        ap.error(f"{out}: no such folder")
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
