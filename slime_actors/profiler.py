"""Profiling a job with slime's flags: the torch profiler on chosen trainer ranks and rollouts, CUDA memory history
with a snapshot on OOM, and the engines' own profilers -- each file written under RUN_DIR/profiles/ so that
`slime-actors trace export RUN` merges it with the messages (slime_actors/recorder/profiles.py).

    --use-pytorch-profiler --profile-step-start 10 --profile-step-end 12 --profile-ranks 0
        [--profile-target train_overall train_actor train_log_probs rollout]
    --record-memory-history [--memory-snapshot-path snapshot.pickle] [--memory-snapshot-num-steps N]

* Trainer ranks in --profile-ranks run the torch profiler (CPU ops, and CUDA kernels on a GPU; shapes, memory, flops)
  for the rollouts in [--profile-step-start, --profile-step-end): over the whole update (`train_overall`), or only
  over its log-prob pass (`train_log_probs`) or its optimizer steps (`train_actor`). A trace per rollout:
  RUN/profiles/trainer-<rank>.<pid>.<target>.step<K>.pt.trace.json.gz, its ranges named after the message that
  caused them ("train_overall rollout 10 m:<message id>"), and a clock marker (CLOCK_MARK) whose wall-clock time is
  in the file's name-sake sidecar (.clock.json) -- how the export lines the profiler's clock up with the traces'.
* `rollout`: each rollout worker asks its engine to profile those rollouts through SGLang's own endpoints
  (/start_profile, /stop_profile): real SGLang writes its traces (<profile id>-TP-<rank>.trace.json.gz); the local
  engine implements the same endpoints (its generation steps, named by their requests' rids).
* --record-memory-history (a GPU): torch.cuda.memory._record_memory_history on those ranks from the start; the
  snapshot (--memory-snapshot-path, under RUN/profiles/) is written when the process runs out of GPU memory, and
  after --memory-snapshot-num-steps rollouts if given (open it in https://pytorch.org/memory_viz).

With --use-pytorch-profiler off (the default) nothing is imported or started; what is left is one attribute test per
rollout (bench/profile_cost.py measures both).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from .log import get_logger
from .recorder.profiles import CLOCK_MARK, PROFILES

log = get_logger(component="profiler")
# how long a rank may be silent while the profiler stops and exports, and while a memory snapshot is written: C++
# calls that keep the GIL, so the rank's heartbeats stop (a GPU step's trace took longer than the 5 s liveness on one
# H100 and the trainer was declared down); the window closes as soon as the work is done
EXPORT_QUIET_S = 300.0
SNAPSHOT_QUIET_S = 600.0


TRAIN_TARGETS = ("train_overall", "train_actor", "train_log_probs")
TARGETS = TRAIN_TARGETS + ("rollout",)


def _no_quiet(seconds: float, why: str) -> None:
    """Without an actor (a bench, a test of the profiler alone) there is no liveness to keep."""


def profiles_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / PROFILES


def mark_clock(record_function) -> dict:
    """Open and close the CLOCK_MARK range while reading the wall clock around it, a few times; the tightest pair
    bounds where the range lies in wall-clock time. Returns {"wall_ns": its middle, "uncertainty_ns": half its
    width} (the export puts the range's middle there: docs/debugging.md, "Profiles")."""
    best = None
    for _ in range(5):
        a = time.time_ns()
        with record_function(CLOCK_MARK):
            pass
        b = time.time_ns()
        if best is None or b - a < best[1] - best[0]:
            best = (a, b)
    a, b = best
    return {"wall_ns": (a + b) // 2, "uncertainty_ns": (b - a) // 2}


class TrainProfiler:
    """A trainer rank's profiling, as slime's TrainProfiler: torch profiler traces of the chosen targets and rollouts,
    CUDA memory history. `phase(target, rollout_id, cause)` wraps a part of the update; it costs an attribute test
    when profiling is off."""

    def __init__(self, debug: Any, rank: int, run_dir: str | os.PathLike, actor: str,
                 quiet: Callable[[float, str], None] = _no_quiet):
        self.enabled = bool(debug.use_pytorch_profiler) and rank in (debug.profile_ranks or [0])
        self.memory = bool(debug.record_memory_history) and rank in (debug.profile_ranks or [0])
        self.start, self.end = int(debug.profile_step_start), int(debug.profile_step_end)
        self.targets = set(debug.profile_target or ["train_overall"]) & set(TRAIN_TARGETS)
        self.dir = profiles_dir(run_dir)
        self.actor = actor
        self.snapshot_name = debug.memory_snapshot_path or "snapshot.pickle"
        self.snapshot_dir = Path(debug.memory_snapshot_dir) if debug.memory_snapshot_dir else self.dir
        self.snapshot_steps = debug.memory_snapshot_num_steps
        self._open = None  # the profiler session open now (torch.profiler.profile)
        self._quiet = quiet  # Actor.expect_silence: the directory's quiet window around work that keeps the GIL
        self.written: list[Path] = []

    # ------------------------------------------------------------------------------------------ torch profiler
    @contextlib.contextmanager
    def phase(self, target: str, rollout_id: int, cause: str | None = None) -> Iterator[None]:
        if not self.enabled or not self.start <= rollout_id < self.end:
            yield
            return
        from torch.profiler import record_function
        name = f"{target} rollout {rollout_id}" + (f" m:{cause}" if cause else "")
        if self._open is not None or target not in self.targets:  # a range inside the session, or nothing
            if self._open is None:
                yield
                return
            with record_function(name):
                yield
            return
        prof, clock = self._start()
        try:
            with record_function(name):
                yield
        finally:
            self._open = None
            self._quiet(EXPORT_QUIET_S, f"torch profiler: stop and export ({target}, rollout {rollout_id})")
            try:
                prof.stop()
                self._export(prof, clock, target, rollout_id, cause)
            finally:
                self._quiet(0.0, "torch profiler: exported")

    def _start(self):
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, record_shapes=True, profile_memory=True, with_flops=True)
        prof.start()
        self._open = prof
        return prof, mark_clock(record_function)

    def _export(self, prof, clock: dict, target: str, rollout_id: int, cause: str | None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        stem = f"{self.actor.replace('/', '-')}.{os.getpid()}.{target}.step{rollout_id}"
        path = self.dir / f"{stem}.pt.trace.json.gz"
        try:
            prof.export_chrome_trace(str(path))
            sidecar = {"actor": self.actor, "pid": os.getpid(), "target": target, "rollout_id": rollout_id,
                       "cause": cause, "clock": clock, "trace": path.name}
            (self.dir / f"{stem}.clock.json").write_text(json.dumps(sidecar))
        except OSError as exc:  # a full disk must not take the training step down
            log.error("could not write a profile", path=str(path), error=repr(exc))
            return
        self.written.append(path)
        log.info("profile written", path=str(path), target=target, rollout_id=rollout_id)

    # ------------------------------------------------------------------------------------------ memory history
    def start_memory_history(self) -> bool:
        """--record-memory-history: record the CUDA allocator's history from now on, and dump a snapshot when the
        process runs out of GPU memory. False (with a log line) where there is no GPU."""
        if not self.memory:
            return False
        import torch
        if not torch.cuda.is_available():
            log.warning("--record-memory-history: no GPU here; the CUDA allocator's history is not recorded")
            return False
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="all")
        torch._C._cuda_attach_out_of_memory_observer(self._on_oom)
        log.info("recording CUDA memory history", snapshot=str(self.snapshot_path("oom")))
        return True

    def snapshot_path(self, when: str) -> Path:
        return self.snapshot_dir / f"{self.actor.replace('/', '-')}.{os.getpid()}.{when}.{self.snapshot_name}"

    def dump_memory_snapshot(self, when: str) -> Path | None:
        import torch
        path = self.snapshot_path(when)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._quiet(SNAPSHOT_QUIET_S, f"CUDA memory snapshot ({when})")
        try:
            torch.cuda.memory._dump_snapshot(str(path))
        except Exception as exc:  # noqa: BLE001 -- a failed dump is reported, the job goes on
            log.error("could not write the memory snapshot", path=str(path), error=repr(exc))
            return None
        finally:
            self._quiet(0.0, "CUDA memory snapshot written")
        log.warning("CUDA memory snapshot written", path=str(path), when=when)
        return path

    def _on_oom(self, device, alloc, device_alloc, device_free) -> None:
        log.error("out of GPU memory", device=device, alloc=alloc, device_alloc=device_alloc,
                  device_free=device_free)
        self.dump_memory_snapshot("oom")

    def after_step(self, rollout_id: int) -> None:
        """--memory-snapshot-num-steps N: the snapshot after rollout N-1, and the history stops (slime's rule)."""
        if self.memory and self.snapshot_steps is not None and rollout_id == self.snapshot_steps - 1:
            import torch
            if torch.cuda.is_available():
                self.dump_memory_snapshot(f"step{rollout_id}")
                torch.cuda.memory._record_memory_history(enabled=None)


def engine_profile_window(debug: Any, rollout_id: int) -> str | None:
    """What a rollout worker does to its engine's profiler as rollout `rollout_id` starts: "start" (the first of
    --profile-step-start..end with --profile-target rollout), "stop" (the first past it), or None."""
    if not debug.use_pytorch_profiler or "rollout" not in (debug.profile_target or ()):
        return None
    if rollout_id == debug.profile_step_start:
        return "start"
    if rollout_id == debug.profile_step_end:
        return "stop"
    return None
