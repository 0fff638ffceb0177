"""A picture of a window of a trace-event JSON file (what `slime-actors trace export` writes): one row per lane of
each process, slices as bars, for when a screenshot of https://ui.perfetto.dev is not at hand.

    .venv/bin/python scripts/perfetto_png.py run.json -o timeline.png [--since S --until S] [--min-ms 0.5]

Times are seconds on the export's clock (0 = the run's first record). Message slices (handlers, asks, tells) are
drawn in blue shades, the profiler's ranges named after a message in red, its CPU ops in grey and GPU kernels in
green; slices shorter than --min-ms are left out of the profiler's lanes (there are tens of thousands). Memory
counters are drawn under their process's lanes.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

COLORS = {"handle": "#4a78b5", "ask": "#9bb7de", "tell": "#c6d6ee", "profile.user_annotation": "#c0392b",
          "profile.cpu_op": "#8c8c8c", "profile.kernel": "#2e8b57", "profile.gpu_memcpy": "#66c2a5"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--since", type=float, default=None)
    p.add_argument("--until", type=float, default=None)
    p.add_argument("--min-ms", type=float, default=0.5)
    p.add_argument("--title", default=None)
    a = p.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    data = json.load(open(a.trace))
    ev = data["traceEvents"]
    pname, tname = {}, {}
    for e in ev:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pname[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            tname[(e["pid"], e["tid"])] = e["args"]["name"]
    lo = a.since * 1e6 if a.since is not None else min(e["ts"] for e in ev if "ts" in e)
    hi = a.until * 1e6 if a.until is not None else max(e["ts"] + e.get("dur", 0) for e in ev if "ts" in e)
    bars = defaultdict(list)
    counters = defaultdict(list)
    for e in ev:
        if "ts" not in e or e["ts"] > hi:
            continue
        if e.get("ph") == "C" and lo <= e["ts"]:
            counters[e["pid"]].append((e["ts"], e["args"].get("allocated", 0)))
            continue
        if e.get("ph") != "X" or e["ts"] + e.get("dur", 0) < lo:
            continue
        cat = e.get("cat", "")
        if cat.startswith("profile.") and cat != "profile.user_annotation" and e.get("dur", 0) < a.min_ms * 1e3:
            continue
        bars[(e["pid"], e["tid"])].append((e["ts"], e.get("dur", 0), cat, e.get("name", "")))
    rows = sorted(bars, key=lambda k: (k[0], k[1]))
    if not rows:
        raise SystemExit("nothing in that window")
    span = (hi - lo) / 1e6
    rows = [k for k in rows if max(d for _, d, _, _ in bars[k]) / 1e6 >= span / 500]  # lanes with something to see
    n_mem = 1 if counters else 0
    fig, axes = plt.subplots(1 + n_mem, 1, figsize=(13, 0.42 * len(rows) + 1.8 + 1.6 * n_mem), sharex=True,
                             gridspec_kw={"height_ratios": [max(len(rows), 1)] + [3] * n_mem}, squeeze=False)
    ax = axes[0][0]
    labels = []
    for i, key in enumerate(rows):
        labels.append(f"{pname.get(key[0], key[0])} · {tname.get(key, key[1])}")
        stack: list[float] = []
        for ts, dur, cat, name in sorted(bars[key], key=lambda b: (b[0], -b[1])):
            while stack and stack[-1] <= ts:
                stack.pop()
            depth = len(stack)
            stack.append(ts + dur)
            x0 = (max(ts, lo) - lo) / 1e6
            w = max((min(ts + dur, hi) - max(ts, lo)) / 1e6, span / 2000)
            y, h = (i, 0.7) if not cat.startswith("profile.") else (i - 0.3 + 0.2 * min(depth, 3) + 0.09, 0.18)
            ax.barh(y, w, left=x0, height=h, color=COLORS.get(cat, "#bbbbbb"), edgecolor="none")
            if cat in ("handle", "profile.user_annotation") and w > span / 10 and depth <= 1:
                ax.text(x0 + w / 2, y, name[:60], ha="center", va="center", fontsize=6, color="white",
                        clip_on=True)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, span)
    for pid, pts in list(counters.items())[:n_mem]:
        mx = axes[1][0]
        pts.sort()
        mx.step([(t - lo) / 1e6 for t, _ in pts], [v / 2**20 for _, v in pts], color="#e67e22", lw=0.8, where="post")
        mx.set_ylabel(f"{pname.get(pid, pid)}\nallocated MiB", fontsize=7)
        mx.tick_params(labelsize=6)
    axes[-1][0].set_xlabel(f"seconds after +{lo / 1e6:.3f} s (the run's clock)")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=c, label=k.replace("profile.", "profiler: ")) for k, c in COLORS.items()],
              fontsize=6, loc="lower right", ncol=4)
    ax.set_title(a.title or f"{a.trace}: {span:.3f} s", fontsize=9)
    fig.tight_layout()
    fig.savefig(a.output, dpi=120)
    print(f"wrote {a.output}: {len(rows)} lanes")


if __name__ == "__main__":
    main()
