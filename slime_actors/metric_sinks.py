"""Where a run's metrics go besides RUN_DIR/metrics.jsonl: TensorBoard (the default) and Weights & Biases.

    sinks = MetricSinks(cfg, run_dir, log)
    sinks.open(resume_at=None)                  # blocking (wandb.init starts a service): call it off the loop
    sinks.scalars(step)                         # every number of a metrics.jsonl row, at step["rollout_id"]
    sinks.samples(k, examples)                  # the best and worst sample of rollout k: TB text, a W&B table
    sinks.eval_responses(name, step, rows)      # an evaluation's responses: a W&B table
    sinks.close(curves_png)                     # the curves picture (W&B), then flush and close

TensorBoard (--use-tensorboard, on by default) writes RUN_DIR/tensorboard; a resumed run hides events from the
resumed step on (purge_step), so the curves span the run once.

W&B (--use-wandb, slime's flags): --wandb-project, --wandb-group, --wandb-team (entity), --wandb-host
(WANDB_BASE_URL), --wandb-mode online|offline|disabled (default $WANDB_MODE, else online), --wandb-dir (default
RUN_DIR/wandb), --wandb-run-id, --disable-wandb-random-suffix; the API key from $WANDB_API_KEY, `wandb login` or
--wandb-key. Every metric is logged against `rollout_id` (W&B's x-axis for all of them), so a resumed run logs its
steps again where they belong. The run's id is kept in RUN_DIR/wandb/run_id: a resumed run continues the same W&B
run unless --wandb-run-id names another. The job's flags are the run's config.
"""

from __future__ import annotations

import os
import random
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

EVAL_TABLE_ROWS = 200   # an evaluation's responses per W&B table (the full set is in RUN_DIR/evals)
SAMPLE_COLUMNS = ["rollout_id", "which", "reward", "group_index", "prompt", "response", "label", "finish_reason"]


class MetricSinks:
    def __init__(self, cfg, run_dir: str | os.PathLike, log):
        self.cfg, self.run_dir, self.log = cfg, Path(run_dir), log
        self.tb = None
        self.wandb = None          # the W&B run
        self._wb = None            # the wandb module

    # ------------------------------------------------------------------------------------------ open / close
    def open(self, resume_at: int | None) -> None:
        logging_cfg = self.cfg.logging
        if logging_cfg.use_tensorboard:
            try:
                from .tb_writer import TensorBoardWriter   # (not torch's SummaryWriter: the head needs no torch)
                self.tb = TensorBoardWriter(str(self.run_dir / "tensorboard"), purge_step=resume_at)
            except Exception as exc:  # tensorboard missing: JSONL and the PNG still have everything
                self.log.warning("tensorboard unavailable", error=repr(exc))
        if logging_cfg.use_wandb:
            self._open_wandb(resume_at)

    def _open_wandb(self, resume_at: int | None) -> None:
        logging_cfg = self.cfg.logging
        try:
            import wandb
        except ImportError:
            raise RuntimeError("--use-wandb needs the wandb package (pip install wandb)") from None
        wdir = Path(logging_cfg.wandb_dir) if logging_cfg.wandb_dir else self.run_dir / "wandb"
        wdir.mkdir(parents=True, exist_ok=True)
        id_file = self.run_dir / "wandb" / "run_id"
        run_id = logging_cfg.wandb_run_id
        if run_id is None and resume_at is not None and id_file.exists():
            run_id = id_file.read_text().strip() or None   # a resumed run continues its W&B run
        if logging_cfg.wandb_host:
            os.environ["WANDB_BASE_URL"] = logging_cfg.wandb_host
        name = None
        if logging_cfg.wandb_group:
            name = logging_cfg.wandb_group if logging_cfg.disable_wandb_random_suffix else \
                f"{logging_cfg.wandb_group}_{''.join(random.choices(string.ascii_lowercase + string.digits, k=6))}"
        kw: dict[str, Any] = dict(project=logging_cfg.wandb_project, group=logging_cfg.wandb_group,
                                  entity=logging_cfg.wandb_team, name=name,
                                  dir=str(wdir), config=self.cfg.to_dict(), id=run_id,
                                  resume="allow" if run_id else None)
        if logging_cfg.wandb_mode:
            kw["mode"] = logging_cfg.wandb_mode
        try:   # wandb's own console lines would interleave with ours: the log line below says where the run is
            kw["settings"] = wandb.Settings(silent=True)
        except Exception:
            pass
        try:
            run = wandb.init(**{k: v for k, v in kw.items() if v is not None})
        except Exception as exc:
            raise RuntimeError(f"--use-wandb: wandb.init failed: {type(exc).__name__}: {exc} (without network or "
                               "an API key: --wandb-mode offline, then `wandb sync`)") from None
        self._wb, self.wandb = wandb, run
        run.define_metric("rollout_id")
        run.define_metric("*", step_metric="rollout_id")
        if getattr(run, "id", None):
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(str(run.id))
        self.log.info("wandb run", id=getattr(run, "id", None),
                      mode=logging_cfg.wandb_mode or os.environ.get("WANDB_MODE") or "online", dir=str(wdir),
                      url=getattr(run, "url", None))

    def close(self, curves_png: str | None = None) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            try:
                if curves_png and os.path.exists(curves_png):
                    self.wandb.log({"curves": self._wb.Image(curves_png)})
                self.wandb.finish()
                teardown = getattr(self._wb, "teardown", None)
                if teardown is not None:   # stop wandb's service now, before the job's processes are stopped
                    teardown()
            except Exception as exc:  # the run's own files have everything; do not fail the job at its end
                self.log.warning("wandb finish failed", error=repr(exc))
            self.wandb = None

    # ------------------------------------------------------------------------------------------ logging
    def scalars(self, step: dict) -> None:
        k = step["rollout_id"]
        numbers = {key: v for key, v in step.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            for key, v in numbers.items():
                if key != "rollout_id":
                    self.tb.add_scalar(key, v, k)
            # (not flushed here: waiting for the writer's thread held up the next step; it writes them in this
            # order and flushes within tb_writer.FLUSH_SECS, and close() flushes the rest)
        if self.wandb is not None:
            self.wandb.log({**numbers, "rollout_id": k})

    def samples(self, k: int, examples: list[dict]) -> None:
        if self.tb is not None:
            from .sample_display import examples_markdown
            self.tb.add_text("rollout/samples", examples_markdown(k, examples), k)
        if self.wandb is not None:
            rows = [[k, e.get("which"), e.get("reward"), e.get("group_index"), _text(e.get("prompt")),
                     _text(e.get("response")), _text(e.get("label")), e.get("finish_reason")] for e in examples]
            self.wandb.log({"rollout/samples": self._wb.Table(columns=SAMPLE_COLUMNS, data=rows), "rollout_id": k})

    def eval_responses(self, name: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        if self.wandb is None or not rows:
            return
        cols = ["index", "prompt", "response", "label", "reward"]
        data = [[r.get("index"), _text(r.get("prompt")), _text(r.get("response")), _text(r.get("label")),
                 r.get("reward")] for r in rows[:EVAL_TABLE_ROWS]]
        self.wandb.log({f"eval/{name}/responses": self._wb.Table(columns=cols, data=data), "rollout_id": step})


def _text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list):   # chat messages
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" if isinstance(m, dict) else str(m)
                         for m in v)
    return str(v)
