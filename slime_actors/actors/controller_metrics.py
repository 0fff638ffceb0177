"""What the controller writes about a run, step by step: metrics.jsonl (one row per training step), TensorBoard, a
log line and a progress bar, the best and the worst sample of each rollout on the console, and at the end curves.png
(slime_actors/plots.py) and the job's result.

`on_rollout_done` runs after every rollout (generated or loaded) with its statistics: the place for anything that
watches rollouts (it may ask other actors: it is awaited before the trainers train on the rollout).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

from ..log import console_write
from ..messages import RolloutStats


@contextmanager
def timed(step: dict, key: str):
    """`with timed(step, "time/train"): ...` -- the seconds the block took, into the step's row."""
    t0 = time.monotonic()
    yield
    step[key] = time.monotonic() - t0


class Metrics:
    def __init__(self, ctl):
        self.ctl = ctl
        self.cfg = ctl.cfg
        self.path: Path | None = None
        self.history: list[dict] = []        # the run's rows (a resumed run: the rows before it too)
        self.first_step = 0                   # the rollout id this (re)start of the schedule began at
        self.last_examples: dict | None = None  # the last rollout's best and worst sample (printed at the end)
        self.result: dict = {}
        self._file = None
        self._tb = None
        self._rows_before_start = 0           # rows of the run before this job resumed it
        self._t_step = 0.0
        self._progress = lambda step: None

    def open(self, resume_at: int | None) -> None:
        """A new run starts metrics.jsonl and TensorBoard afresh (the run directory was cleared); a resumed run
        continues them: the rows of the rollouts before the checkpoint stay (in the history too, so curves.png
        spans the whole run), later rows -- trained again now -- are dropped, and TensorBoard hides its events
        from that step on (purge_step)."""
        self.path = Path(self.ctl.runtime.run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_at is not None:
            self.history = rows_before(self.path, resume_at) + self.history
            tmp = self.path.with_name("metrics.jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in self.history))
            os.replace(tmp, self.path)
            self.ctl.log.info("continuing the run's metrics", rows_kept=len(self.history), from_rollout=resume_at)
        self._rows_before_start = len(self.history)
        self._file = open(self.path, "a")
        if self.cfg.logging.use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self._tb = SummaryWriter(os.path.join(self.ctl.runtime.run_dir, "tensorboard"), purge_step=resume_at)
            except Exception as exc:  # tensorboard missing: JSONL and the PNG still have everything
                self.ctl.log.warning("tensorboard unavailable", error=repr(exc))

    def progress_from(self, start: int) -> None:
        """The schedule (re)starts at rollout `start`: a progress bar from there (--progress)."""
        self.first_step = start
        self._progress = _progress(self.cfg.run, start)

    def drop_from(self, rollout_id: int) -> None:
        """The training group restarted from a checkpoint: the rows from `rollout_id` on are trained again."""
        self.history = [h for h in self.history if h["rollout_id"] < rollout_id]

    def begin(self, k: int, version: int) -> dict:
        """Step k's row, filled in as the step runs and written by `record`."""
        self._t_step = time.monotonic()
        return {"rollout_id": k, "weight_version": version}

    async def on_rollout_done(self, k: int, step: dict, stats: RolloutStats, seconds: float) -> None:
        """Rollout k is complete (`seconds`: how long it took to generate; 0 when loaded from a file)."""
        step.update({f"rollout/{key}": v for key, v in stats.numbers().items()})
        step["time/rollout"] = seconds
        self._show_samples(k, stats.examples)

    def record(self, step: dict) -> None:
        step["time/step"] = time.monotonic() - self._t_step
        step["time"] = time.time()
        self.history.append(step)
        self._file.write(json.dumps(step) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, v in step.items():
                if isinstance(v, (int, float)) and key != "rollout_id":
                    self._tb.add_scalar(key, v, step["rollout_id"])
            self._tb.flush()
        self.ctl.log.info("step", rollout_id=step["rollout_id"], reward=_r(step.get("rollout/reward_mean")),
                          loss=_r(step.get("train/loss")),
                          logprob_diff=_r(step.get("train/train_rollout_logprob_abs_diff_max")),
                          seconds=_r(step.get("time/step")), version=step.get("weight_version_after"))
        self._progress(step)

    def _show_samples(self, k: int, examples: list | None) -> None:
        """The best and the worst sample of one group (the buffer picks them): on the console every
        --log-samples-interval rollouts and after the last, as TensorBoard text every rollout, in the result."""
        if not examples:
            return
        from ..samples import examples_markdown, format_examples
        self.last_examples = {"rollout_id": k, "examples": examples}
        every = self.cfg.logging.log_samples_interval
        if every and (k % every == 0 or k + 1 == self.cfg.run.num_rollout):
            console_write(format_examples(k, examples))
        if self._tb is not None:
            self._tb.add_text("rollout/samples", examples_markdown(k, examples), k)

    def finish(self, accounting: dict | None) -> dict:
        """Close the files, draw curves.png, and put together the job's result."""
        from ..plots import plot_run
        ctl, evals = self.ctl, self.ctl.evals
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
        png = plot_run(ctl.runtime.run_dir, self.history, evals)
        first = {e["name"]: e["reward"] for e in evals if e["step"] == min(x["step"] for x in evals)} if evals else {}
        last = {e["name"]: e["reward"] for e in evals if e["step"] == max(x["step"] for x in evals)} if evals else {}
        self.result = {"steps": len(self.history) - self._rows_before_start, "eval_before": first,
                       "eval_after": last, "plot": png, "samples": self.last_examples, "weight_version": ctl.version,
                       "metrics": str(self.path), "recoveries": ctl.group.recoveries, "accounting": accounting}
        return self.result


def _r(v):
    return None if v is None else round(float(v), 4)


def rows_before(path: Path, rollout_id: int) -> list[dict]:
    """metrics.jsonl rows of the rollouts before `rollout_id` (a torn last line, from a crash, is skipped)."""
    rows = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return rows
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("rollout_id"), int) and row["rollout_id"] < rollout_id:
            rows.append(row)
    return rows


def _progress(run, start: int):
    if not run.progress:
        return lambda step: None
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda step: None
    bar = tqdm(total=run.num_rollout, initial=start, desc="rl steps", unit="step", dynamic_ncols=True)

    def update(step: dict) -> None:
        post = {"reward": _r(step.get("rollout/reward_mean"))}
        for k, v in step.items():
            if k.startswith("eval/"):
                post[k] = _r(v)
        bar.set_postfix(post)
        bar.update(1)
        if step["rollout_id"] + 1 >= run.num_rollout:
            bar.close()
    return update
