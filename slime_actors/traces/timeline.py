"""`slime-actors trace timeline RUN --step K -o step.png`: one training step as a picture.

One row per actor. Bars are handled messages (from arrival to the end of handling), coloured by method; overlapping
handlers (async ones run concurrently) are stacked inside the row. Thin arrows go from each ask or tell to where it
was received; dots mark recorded inputs (engine answers, clock readings). The x axis is seconds since the step began.
"""

from __future__ import annotations

from pathlib import Path

from .export import actor_sort_key
from .query import QueryError, step_window
from .reader import TraceRun

MAX_ARROWS = 600
MAX_LANES = 6


def render_step(run: TraceRun, k: int, out: str | Path, *, arrows: bool = True, width: float = 16.0) -> dict:
    st = step_window(run, k)
    return render_window(run, st.start_ns, st.end_ns, out, title=f"step {k}", arrows=arrows, width=width)


def render_window(run: TraceRun, t_start: int, t_end: int, out: str | Path, *, title: str = "",
                  arrows: bool = True, width: float = 16.0) -> dict:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if t_end <= t_start:
        raise QueryError(f"empty time window ({t_start}..{t_end})")
    msgs = run.messages()
    actors = sorted(run.actors(), key=actor_sort_key)
    row = {a: i for i, a in enumerate(actors)}

    def x(t_ns: int) -> float:
        return (t_ns - t_start) / 1e9

    bars: dict[str, list[tuple[float, float, str]]] = {a: [] for a in actors}   # actor -> (start, end, method)
    links: list[tuple[float, str, float, str]] = []
    for m in msgs.values():
        h = m.header
        if h.get("kind") not in ("tell", "ask") or m.recv is None:
            continue
        end_ev = max((e for e in (m.handled, m.reply_sent, m.recv) if e is not None), key=lambda e: e.t_ns)
        if end_ev.t_ns < t_start or m.recv.t_ns > t_end:
            continue
        bars.setdefault(m.recv.actor, []).append((x(m.recv.t_ns), x(end_ev.t_ns), m.method))
        if m.send is not None and t_start <= m.send.t_ns <= t_end:
            links.append((x(m.send.t_ns), m.send.actor, x(m.recv.t_ns), m.recv.actor))

    # colours: the methods that take the most time in this window get their own
    busy: dict[str, float] = {}
    for lst in bars.values():
        for s, e, meth in lst:
            busy[meth] = busy.get(meth, 0.0) + (e - s)
    top = [mname for mname, _ in sorted(busy.items(), key=lambda kv: -kv[1])[:12]]
    cmap = plt.get_cmap("tab20")
    color = {mname: cmap(i % 20) for i, mname in enumerate(top)}
    other = (0.6, 0.6, 0.6, 1.0)

    height = 1.2 + 0.55 * len(actors)
    fig, ax = plt.subplots(figsize=(width, height))
    span = (t_end - t_start) / 1e9
    min_w = span / 2000.0  # a bar at least this wide, so instant handlers still show
    for a, lst in bars.items():
        if a not in row:
            continue
        lst.sort()
        lanes: list[float] = []
        placed: list[tuple[float, float, str, int]] = []
        for s, e, meth in lst:
            for i, end in enumerate(lanes):
                if end <= s:
                    lanes[i] = e
                    placed.append((s, e, meth, i))
                    break
            else:
                lanes.append(e)
                placed.append((s, e, meth, len(lanes) - 1))
        n = min(max(len(lanes), 1), MAX_LANES)
        h = 0.8 / n
        y0 = row[a] - 0.4
        for s, e, meth, lane in placed:
            lane = min(lane, n - 1)
            s_c, e_c = max(s, 0.0), min(e, span)
            ax.broken_barh([(s_c, max(e_c - s_c, min_w))], (y0 + lane * h, h * 0.9),
                           facecolors=color.get(meth, other), edgecolor="none")
    if arrows:
        for xs, a, xr, b in links[:MAX_ARROWS]:
            if a in row and b in row and a != b:
                ax.annotate("", xy=(xr, row[b]), xytext=(xs, row[a]),
                            arrowprops={"arrowstyle": "->", "lw": 0.4, "alpha": 0.35, "color": "black"})
    for f in run.files:
        a = f.meta.get("actor")
        if a not in row:
            continue
        pts = [x(e.t_ns) for e in f.events if e.ev == "input" and t_start <= e.t_ns <= t_end]
        if pts:
            ax.plot(pts, [row[a] + 0.45] * len(pts), linestyle="none", marker="|", markersize=5, color="black",
                    alpha=0.6)
    ax.set_yticks(range(len(actors)))
    ax.set_yticklabels(actors)
    ax.set_ylim(len(actors) - 0.5, -0.5)
    ax.set_xlim(0, span)
    ax.set_xlabel("seconds since the step began")
    ax.grid(axis="x", alpha=0.3)
    n_msgs = sum(len(v) for v in bars.values())
    ax.set_title(f"{run.root}  {title}: {span:.3f} s, {n_msgs} messages handled"
                 + (f" (arrows: first {MAX_ARROWS} of {len(links)})" if arrows and len(links) > MAX_ARROWS else ""))
    handles = [Patch(color=color[mname], label=mname) for mname in top]
    if any(meth not in color for lst in bars.values() for _, _, meth in lst):
        handles.append(Patch(color=other, label="other"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False,
                  title="handled (method)")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return {"path": str(out), "seconds": span, "messages": n_msgs, "arrows": min(len(links), MAX_ARROWS),
            "actors": actors}
