"""Pictures of a run: reward and eval curves (PNG), written at the end of training."""

from __future__ import annotations

import os

ALARM_PREFIX = "hack/alarm/"


def alarm_marks(history: list[dict]) -> list[tuple[int, list[str]]]:
    """(training step, names of the reward-hacking alarms that tripped in it) for each step where one did: the steps'
    `hack/alarm/<name>` metrics (slime_actors.monitor.hacking) at 1."""
    marks = []
    for h in history:
        names = sorted(k[len(ALARM_PREFIX):] for k, v in h.items() if k.startswith(ALARM_PREFIX) and v)
        if names:
            marks.append((h["rollout_id"] + 1, names))
    return marks


# the alarms' names as the picture writes them, short enough to stand beside a line
_ALARM_SHORT = {"rewarded_truncated": "cut off", "collapse": "collapse", "answer_absent": "no answer",
                "prompt_blind": "blind", "jump": "jump"}


def _mark_alarms(ax, marks: list[tuple[int, list[str]]]) -> None:
    """A red dashed line at each step where an alarm tripped, named (from the bottom) where the set changes."""
    prev = None
    for i, (step, names) in enumerate(marks):
        ax.axvline(step, color="tab:red", ls="--", lw=1, alpha=0.6, label="hack alarm" if i == 0 else None)
        if names != prev:
            ax.annotate(" + ".join(_ALARM_SHORT.get(n, n) for n in names), (step, 0.02),
                        xycoords=("data", "axes fraction"), rotation=90, va="bottom", ha="right", fontsize=7,
                        color="tab:red")
        prev = names


def plot_run(run_dir: str, history: list[dict], evals: list[dict]) -> str | None:
    """Write RUN_DIR/curves.png: rollout reward per step, eval reward per eval set (with a red line at each step where
    a reward-hacking alarm tripped), loss and step time."""
    if not history and not evals:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    xs = [h["rollout_id"] + 1 for h in history if h.get("rollout/reward_mean") is not None]
    ys = [h["rollout/reward_mean"] for h in history if h.get("rollout/reward_mean") is not None]
    if xs:
        ax.plot(xs, ys, ".-", alpha=0.6, label="rollout reward (train prompts)")
    for name in sorted({e["name"] for e in evals}):
        pts = sorted((e["step"], e["reward"]) for e in evals if e["name"] == name)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", lw=2, label=f"eval: {name}")
    _mark_alarms(ax, alarm_marks(history))
    ax.set_xlabel("training step")
    ax.set_ylabel("reward")
    ax.set_title("reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)

    ax = axes[1]
    for key, label in (("train/loss", "loss"), ("train/pg_loss", "policy loss"), ("train/kl_loss", "kl loss")):
        pts = [(h["rollout_id"] + 1, h[key]) for h in history if h.get(key) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ".-", label=label)
    ax.set_xlabel("training step")
    ax.set_title("losses")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)

    ax = axes[2]
    parts = [("time/rollout", "rollout"), ("time/train", "train"), ("time/weight_sync", "weight sync"),
             ("time/eval", "eval"), ("time/save", "checkpoint"), ("time/save_hf", "HF export")]
    bottom = [0.0] * len(history)
    steps = [h["rollout_id"] + 1 for h in history]
    for key, label in parts:
        vals = [float(h.get(key) or 0.0) for h in history]
        ax.bar(steps, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    other = [max(0.0, float(h.get("time/step") or 0.0) - b) for h, b in zip(history, bottom)]
    ax.bar(steps, other, bottom=bottom, label="other")
    ax.set_xlabel("training step")
    ax.set_ylabel("seconds")
    ax.set_title("step time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(run_dir, "curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
