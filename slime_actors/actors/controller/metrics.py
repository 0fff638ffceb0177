"""What the controller writes about a run, step by step: metrics.jsonl (one row per training step), TensorBoard and
W&B (slime_actors/metric_sinks.py), a log line and the progress footer, the best and the worst sample of each rollout
on the console, and at the end curves.png (slime_actors/plots.py) and the job's result (status done or stopped).

`on_rollout_done` runs after every rollout (generated or loaded) with its statistics: the place for anything that
watches rollouts (it may ask other actors: it is awaited before the trainers train on the rollout). The buffer's
reward-hacking monitor reports in `on_hack_report` (the loop asks for the report while the trainers train and hands
it over once they are done, before the buffer frees the rollout): its hack/* metrics go into the step's row, each
tripped alarm into RUN_DIR/alarms.jsonl with a warning, and with --hack-alarms stop `stopping` says why the run ends
after this step (the loop saves a checkpoint and asks `stop_after(k)`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ...json_files import parse_json
from ...log import CONSOLE, console_write, progress_line
from ...messages import Accounting, RolloutStats
from ...monitor.alarms import record_hack_alarms, stop_reason, trim_alarms

if TYPE_CHECKING:
    from ...config import RunSection
    from ...metric_sinks import MetricSinks
    from .actor import Controller


@contextmanager
def timed(step: dict, key: str):
    """`with timed(step, "time/train"): ...` -- the seconds the block took, into the step's row."""
    t0 = time.monotonic()
    yield
    step[key] = time.monotonic() - t0


class Metrics:
    def __init__(self, ctl: Controller):
        self.ctl = ctl
        self.cfg = ctl.cfg
        self.path: Path | None = None
        self.history: list[dict] = []        # the run's rows (a resumed run: the rows before it too)
        self.first_step = 0                   # the rollout id this (re)start of the schedule began at
        self.last_examples: dict | None = None  # the last rollout's best and worst sample (printed at the end)
        self.result: dict = {}
        self.stopping: str | None = None      # --hack-alarms stop: why the run ends after the step running
        self.stopped: dict | None = None      # why the run ended before --num-rollout
        self._file: IO[str] | None = None
        self.sinks: MetricSinks | None = None                    # TensorBoard and W&B (slime_actors.metric_sinks)
        self._rows_before_start = 0           # rows of the run before this job resumed it
        self._t_step = 0.0
        self._progress: _NoProgress = _NoProgress()
        self._unwritten: list[dict] = []      # rows recorded, written once the next step's first asks are out

    @property
    def opened(self) -> bool:
        """Whether `open` ran (a training group that fails while the job prepares restarts before it did)."""
        return self._file is not None

    async def open(self, resume_at: int | None) -> None:
        """A new run starts metrics.jsonl and TensorBoard afresh (the run directory was cleared); a resumed run
        continues them: the rows of the rollouts before the checkpoint stay (in the history too, so curves.png
        spans the whole run), later rows -- trained again now -- are dropped, and TensorBoard hides its events
        from that step on (purge_step)."""
        self.path = Path(self.ctl.runtime.run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_at is not None:
            self.history = rows_before(self.path, resume_at) + self.history
            trim_alarms(self.ctl.runtime.run_dir, before=resume_at)
            tmp = self.path.with_name("metrics.jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in self.history))
            os.replace(tmp, self.path)
            self.ctl.log.info("continuing the run's metrics", rows_kept=len(self.history), from_rollout=resume_at)
        self._rows_before_start = len(self.history)
        self._file = open(self.path, "a")
        from ...metric_sinks import MetricSinks
        sinks = MetricSinks(self.cfg, self.ctl.runtime.run_dir, self.ctl.log)
        await self.ctl.run_blocking(sinks.open, resume_at)   # wandb.init starts a service: off the loop
        self.sinks = sinks

    def progress_from(self, start: int) -> None:
        """The schedule (re)starts at rollout `start`: a progress footer from there (--progress)."""
        self.first_step = start
        self._progress = _progress(self.cfg.run, start)

    def drop_from(self, rollout_id: int) -> None:
        """The training group restarted from a checkpoint: the rows from `rollout_id` on are trained again."""
        self.flush()
        self.history = [h for h in self.history if h["rollout_id"] < rollout_id]
        if self.path is not None:   # (the run's files are open: a recovery before `open` has no alarms to trim)
            trim_alarms(self.path.parent, before=rollout_id)

    def begin(self, k: int, version: int) -> dict:
        """Step k's row, filled in as the step runs and written by `record`."""
        self._t_step = time.monotonic()
        self.stopping = None
        return {"rollout_id": k, "weight_version": version}

    async def on_rollout_done(self, k: int, step: dict, stats: RolloutStats, seconds: float) -> None:
        """Rollout k is complete (`seconds`: how long it took to generate; 0 when loaded from a file)."""
        step.update({f"rollout/{key}": v for key, v in stats.numbers().items()})
        step.update({f"passrate/{key}": v for key, v in stats.passrate.items()})  # --log-passrate
        step["time/rollout"] = seconds
        self._show_samples(k, stats.examples)

    def on_hack_report(self, k: int, step: dict, report: dict | None) -> None:
        """The buffer's hacking report on rollout k (None: --hack-alarms off): hack/* metrics into the step, each
        tripped alarm into RUN_DIR/alarms.jsonl and a warning; with --hack-alarms stop and an alarm tripped, why the
        run stops."""
        metrics, tripped = record_hack_alarms(self.ctl.runtime.run_dir, k, report, self.ctl.log)
        step.update(metrics)
        if tripped and self.cfg.monitor.hack_alarms == "stop":
            self.stopping = stop_reason(k, tripped)

    def stop_after(self, k: int) -> bool:
        """Whether the run ends after step k (--hack-alarms stop, an alarm tripped on rollout k): why, in `stopped`
        (the status and the result), with the checkpoint saved after it."""
        if not self.stopping:
            return False
        self.flush()
        ckpt = self.ctl.checkpoints.latest
        self.stopped = {"reason": self.stopping, "rollout_id": k, "steps_left": self.cfg.run.n_rollouts - k - 1,
                        "checkpoint": str(ckpt) if ckpt else None}
        self.ctl.log.warning("run stopped by a hack alarm", reason=self.stopping, checkpoint=self.stopped["checkpoint"])
        self._progress.close()
        return True

    @property
    def end(self) -> int:
        """The rollout id the run ends before: --num-rollout, or the one after a --hack-alarms stop."""
        return self.stopped["rollout_id"] + 1 if self.stopped else self.cfg.run.n_rollouts

    def record(self, step: dict) -> None:
        """Step k ended: its row. Written (metrics.jsonl, TensorBoard, the console) once the next step's first asks
        are out -- two turns of the event loop from now, or at `flush` --: the row's writing (most of a millisecond
        on a GPU host) is no longer a gap between two steps (docs/performance.md)."""
        step["time/step"] = time.monotonic() - self._t_step
        step["time"] = time.time()
        self.history.append(step)
        if self._file is None:
            raise RuntimeError("metrics: a step recorded before open()")
        self._unwritten.append(step)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        if len(self._unwritten) == 1:   # (the next step's asks are sent by tasks that first run in the next turn)
            loop.call_soon(loop.call_soon, self._flush_soon)

    def _flush_soon(self) -> None:
        # (a callback of the event loop: a row that cannot be written -- a full disk -- is said, not raised into
        # asyncio's handler; the job's end writes what is left, and fails there if it still cannot)
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001
            self.ctl.log.error("could not write a step's row to the run's metrics", error=repr(exc))

    def flush(self) -> None:
        """Write the rows recorded and not written yet, in order."""
        while self._unwritten:
            self._write(self._unwritten.pop(0))

    def _write(self, step: dict) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(step) + "\n")
        self._file.flush()
        if self.sinks is not None:
            self.sinks.scalars(step)
        self.ctl.log.info("step", rollout_id=step["rollout_id"], reward=_r(step.get("rollout/reward_mean")),
                          loss=_r(step.get("train/loss")),
                          logprob_diff=_r(step.get("train/train_rollout_logprob_abs_diff")),
                          logprob_diff_max=_r(step.get("train/train_rollout_logprob_abs_diff_max")),
                          seconds=_r(step.get("time/step")), version=step.get("weight_version_after"))
        self._progress(step)

    def _show_samples(self, k: int, examples: list | None) -> None:
        """The best and the worst sample of one group (the buffer picks them): on the console every
        --log-samples-interval rollouts and after the last, as TensorBoard text every rollout, in the result."""
        if not examples:
            return
        from ...sample_display import format_examples
        self.last_examples = {"rollout_id": k, "examples": examples}
        every = self.cfg.logging.log_samples_interval
        if every and (k % every == 0 or k + 1 == self.cfg.run.num_rollout):
            console_write(format_examples(k, examples))
        if self.sinks is not None:
            self.sinks.samples(k, examples)

    async def finish(self, accounting: Accounting | None) -> dict:
        """Close the files, draw curves.png, and put together the job's result (off the loop: the plot, closing
        TensorBoard and W&B)."""
        return await self.ctl.run_blocking(self._finish, accounting)

    def _finish(self, accounting: Accounting | None) -> dict:
        from ...plots import plot_run
        ctl, evals = self.ctl, self.ctl.evaluations.history
        self.flush()
        if self._file is not None:
            self._file.close()
        png = plot_run(ctl.runtime.run_dir, self.history, evals)
        if self.sinks is not None:
            self.sinks.close(png)
        first = {e["name"]: e["reward"] for e in evals if e["step"] == min(x["step"] for x in evals)} if evals else {}
        last = {e["name"]: e["reward"] for e in evals if e["step"] == max(x["step"] for x in evals)} if evals else {}
        from ...eval_config import eval_sets, grader_name
        graders = {s.name: grader_name(ctl.cfg, s) for s in eval_sets(ctl.cfg)} if evals else {}
        self.result = {"status": "stopped" if self.stopped else "done", "stopped": self.stopped,
                       "steps": len(self.history) - self._rows_before_start, "eval_before": first,
                       "eval_after": last, "eval_graders": graders, "plot": png, "samples": self.last_examples,
                       "weight_version": ctl.version, "metrics": str(self.path), "recoveries": ctl.group.recoveries,
                       "accounting": accounting,
                       "checkpoint": str(ctl.checkpoints.latest) if ctl.checkpoints.latest else None,
                       "rolling_checkpoint": ctl.checkpoints.rolling, "started_from": ctl.checkpoints.started_from}
        return self.result


def _r(v):
    return None if v is None else round(float(v), 4)


def rows_before(path: Path, rollout_id: int) -> list[dict]:
    """metrics.jsonl rows of the rollouts before `rollout_id` (a torn last line, from a crash, is skipped)."""
    rows: list[dict] = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return rows
    for line in lines:
        try:
            row = parse_json(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("rollout_id"), int) and row["rollout_id"] < rollout_id:
            rows.append(row)
    return rows


class _NoProgress:
    """No progress footer (--no-progress, or not a terminal)."""

    def __call__(self, step: dict) -> None:
        return None

    def close(self) -> None:
        return None


class _ProgressFooter(_NoProgress):
    """The progress bar: a part of the console's footer (log.CONSOLE), updated with each step's row. `close()`
    takes it off (a run that ends early: --hack-alarms stop)."""

    def __init__(self, run: RunSection, start: int):
        self.total, self.start, self.t0 = run.n_rollouts, start, time.monotonic()
        self.last_eval: dict = {}
        CONSOLE.footer("progress", progress_line("rl steps", start, self.total, None))

    def __call__(self, step: dict) -> None:
        done = step["rollout_id"] + 1
        self.last_eval.update({k[5:]: _r(v) for k, v in step.items() if k.startswith("eval/") and "-pass@" not in k})
        extra = {"reward": _r(step.get("rollout/reward_mean")), **{f"eval {k}": v for k, v in self.last_eval.items()}}
        rate = (time.monotonic() - self.t0) / max(done - self.start, 1)
        CONSOLE.footer("progress", None if done >= self.total else
                       progress_line("rl steps", done, self.total, rate, extra))

    def close(self) -> None:
        CONSOLE.footer("progress", None)


def _progress(run: RunSection, start: int) -> _NoProgress:
    """The progress footer, on a terminal only (--progress)."""
    if not run.progress or not CONSOLE.interactive:
        return _NoProgress()
    return _ProgressFooter(run, start)
