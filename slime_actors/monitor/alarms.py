"""The reward-hacking alarms in a running job: the buffer's monitor, built from the flags; the wire form of what it
found in a rollout; and what the controller does with that (metrics, RUN_DIR/alarms.jsonl, a warning, the stop).

    # the buffer, when a training rollout completes (every scored sample, the groups the filter dropped included)
    monitor = make_monitor(cfg)                       # None with --hack-alarms off: nothing is computed
    stats["hack"] = report_wire(monitor.observe(rollout_id, samples))

    # the controller, with the rollout's stats
    metrics, tripped = record_hack_alarms(run_dir, rollout_id, stats.get("hack"), log)
    step.update(metrics)                              # hack/* in metrics.jsonl, TensorBoard, curves.png's marks
    if tripped and cfg.monitor.hack_alarms == "stop": # finish the step, save a checkpoint, end the run
        ... stop_reason(rollout_id, tripped) ...
    trim_alarms(run_dir, before=k)                    # a resumed run, a training-group restart: rollouts >= k redone

RUN_DIR/alarms.jsonl holds one JSON line per tripped alarm: the signal (the alarm's name), the rollout, the value
against its threshold, the message, and one sample that shows it (prompt, response, reward, label, finish reason).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..json_files import parse_json
from .hacking import ALARMS, AlarmMonitor, HackThresholds, Report

ALARMS_FILE = "alarms.jsonl"

# built-in rewards that compare the response with a literal label (answer_absent means something for them)
LABEL_REWARDS = frozenset({"math", "boxed_math", "dapo", "boxed", "exact_match", "exact_match_ci", "deepscaler"})


def label_is_answer(cfg) -> bool:
    """Whether the job's reward compares each response with a literal label: --hack-alarm-label-answer when given,
    else true for the built-in rewards that do (LABEL_REWARDS, and boxed_<one of them>), false for a custom reward
    function or actor, f1 (partial credit), remote_rm and random."""
    given = cfg.monitor.hack_alarm_label_answer
    if given is not None:
        return bool(given)
    reward_cfg = cfg.reward
    if reward_cfg.custom_rm_path or reward_cfg.reward_actor_class or not reward_cfg.rm_type:
        return False
    rm = reward_cfg.rm_type.strip()
    return rm in LABEL_REWARDS or (rm.startswith("boxed_") and rm[len("boxed_"):] in LABEL_REWARDS)


def make_monitor(cfg) -> AlarmMonitor | None:
    """The job's AlarmMonitor (its thresholds, response-length limit, reward kind and enabled alarms from the
    flags), or None with --hack-alarms off."""
    monitor_cfg = cfg.monitor
    if monitor_cfg.hack_alarms == "off":
        return None
    ignore = set(monitor_cfg.hack_alarms_ignore or ())
    thresholds = cfg.hack_thresholds   # --hack-alarm-thresholds as the config parsed it (JobConfig.validate)
    if thresholds is None:
        if monitor_cfg.hack_alarm_thresholds:
            raise ValueError("make_monitor: a job config that was not validated (JobConfig.validate parses "
                             "--hack-alarm-thresholds)")
        thresholds = HackThresholds()
    return AlarmMonitor(thresholds,
                        max_response_len=cfg.rollout.rollout_max_response_len,
                        label_is_answer=label_is_answer(cfg),
                        alarms=[a for a in ALARMS if a not in ignore])


def report_wire(report: Report) -> dict:
    """What the buffer returns in a rollout's stats (msgpack-able): its hack/* metrics, the tripped alarms (each
    with its example sample), and why each other alarm could not trip."""
    return {"rollout_id": report.rollout_id, "metrics": dict(report.metrics),
            "alarms": [a.to_dict() for a in report.alarms], "skipped": dict(report.skipped)}


def failed_wire(rollout_id: int, exc: BaseException) -> dict:
    """The stats entry when the monitor could not read a rollout (the controller warns; training goes on)."""
    return {"rollout_id": rollout_id, "error": f"{type(exc).__name__}: {exc}"[:2000]}


# ---------------------------------------------------------------------------------------------- the controller
def record_hack_alarms(run_dir: str | os.PathLike, rollout_id: int, hack: Any, log) -> tuple[dict, list[dict]]:
    """Handle one rollout's `hack` stats: returns (the hack/* metrics for the step, the tripped alarms). Each
    tripped alarm is appended to RUN_DIR/alarms.jsonl and logged as one warning that names the alarm, the rollout
    and its example sample. `hack` None (--hack-alarms off, or a rollout already trained) does nothing; a monitor
    failure (`error`) or a malformed entry is a warning, never a failed step."""
    if hack is None:
        return {}, []
    if not isinstance(hack, dict):
        log.warning("hack monitor: ignored a stats entry that is not a table", rollout_id=rollout_id,
                    got=type(hack).__name__)
        return {}, []
    if hack.get("error"):
        log.warning("hack monitor could not read the rollout; no hack/* metrics for it", rollout_id=rollout_id,
                    error=hack["error"])
        return {}, []
    metrics = {k: float(v) for k, v in (hack.get("metrics") or {}).items()
               if isinstance(k, str) and k.startswith("hack/") and isinstance(v, (int, float))
               and not isinstance(v, bool)}
    tripped = [a for a in hack.get("alarms") or [] if isinstance(a, dict) and a.get("name")]
    if tripped:
        path = Path(run_dir) / ALARMS_FILE
        rows = [alarm_row(rollout_id, a) for a in tripped]
        with open(path, "a") as f:
            f.write("".join(json.dumps(r, default=str) + "\n" for r in rows))
        for r in rows:
            log.warning(f"hack alarm {r['signal']}: {r['message']}", alarm=r["signal"], rollout_id=rollout_id,
                        value=_round(r["value"]), threshold=r["threshold"],
                        sample=(r["example"] or {}).get("index"), times=r["count"], see=str(path))
    return metrics, tripped


def alarm_row(rollout_id: int, alarm: dict) -> dict:
    """One line of alarms.jsonl: the signal, rollout, value, threshold, message and the example sample."""
    return {"time": time.time(), "rollout_id": rollout_id, "signal": alarm["name"], "metric": alarm.get("metric"),
            "value": alarm.get("value"), "threshold": alarm.get("threshold"), "count": alarm.get("count", 1),
            "message": alarm.get("message", ""), "example": alarm.get("example"),
            "details": alarm.get("details") or {}}


def read_alarms(run_dir: str | os.PathLike) -> list[dict]:
    """The rows of RUN_DIR/alarms.jsonl (none when it does not exist; a torn last line from a crash is skipped)."""
    path = Path(run_dir) / ALARMS_FILE
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for line in lines:
        try:
            row = parse_json(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def trim_alarms(run_dir: str | os.PathLike, before: int) -> int:
    """Drop the alarms of rollouts >= `before` (a resumed run, a training-group restart: those rollouts are done
    again, and trip again if they still should); returns how many were dropped."""
    path = Path(run_dir) / ALARMS_FILE
    if not path.exists():
        return 0
    rows = read_alarms(run_dir)
    kept = [r for r in rows if isinstance(r.get("rollout_id"), int) and r["rollout_id"] < before]
    if len(kept) == len(rows):
        return 0
    tmp = path.with_name(ALARMS_FILE + ".tmp")
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in kept))
    os.replace(tmp, path)
    return len(rows) - len(kept)


def stop_reason(rollout_id: int, tripped: list[dict]) -> str:
    """Why --hack-alarms stop ended the run, in one line."""
    names = ", ".join(sorted({a["name"] for a in tripped}))
    return (f"hack alarm ({names}) tripped at rollout {rollout_id} with --hack-alarms stop; see {ALARMS_FILE}")


def _round(v):
    return round(v, 4) if isinstance(v, float) else v
