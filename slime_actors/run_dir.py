"""The run directory: what a job keeps there, and the only code that deletes anything in it.

A run directory carries a marker file, `.slime-actors-run`, written when a job (or the demo) creates it. Nothing is
ever deleted in a directory without the marker, and inside one only the names listed here are touched -- never a
checkpoint (--save), an HF export (--save-hf) or any other file a user put there.

    state = inspect_run_dir(path)            # reads only: "new", "ours" or "legacy"; RunDirError for anything else
    prepare_run_dir(path, resume=False)      # after every other check passed: create / clear / archive

* A missing or empty directory is created and marked; so is a directory without the marker that holds none of the
  names listed here (its files are not ours and are never touched).
* A directory without the marker that holds such names (`--run-dir .` in a project with a logs/ folder) is refused:
  RunDirError names them. One exception: a run directory of an earlier slime-actors version (its job.json is one
  this project wrote) is adopted and marked.
* A new run (nothing to resume) into one of ours clears the previous run's live state and history (LIVE + HISTORY).
  Never under a job that is running there (`run_in_use`: the head refuses to start; a second `make train` in
  another terminal cleared the first job's sockets and keys, which then hung).
  Except when that run did not finish (interrupted, failed, killed) and left a rolling checkpoint with trained steps:
  `unfinished_run` says so, and the head refuses to start (launch/prepare.py) -- re-running the same command after a
  Ctrl-C, a crash or a preemption deleted the run's progress without a word.
* The rolling checkpoint of a job without --save (`ckpt/`, with its own marker; slime_actors/checkpoints.py) belongs
  to its run: the next run clears it unless it resumes from it. A `ckpt/` without that marker is never touched.
* A resumed run (--load found a checkpoint) clears only the live state (a new job never inherits a buffer log,
  sockets or keys) and moves the previous attempt's traces, logs and job files to `attempts/N/`; metrics.jsonl,
  TensorBoard events, recoveries.jsonl and curves.png stay and are continued (the controller appends).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from .checkpoints import ROLLING_DIR, ROLLING_MARKER
from .json_files import read_small_json

MARKER = ".slime-actors-run"
# the live state of a job: never carried into the next one
LIVE_DIRS = ("buffer", "sockets", "weights", "keys", "checked-prompts")
LIVE_FILES = ("head.json", "status.json", "job.json", "result.json")
LIVE_GLOBS = ("job-agent-*.json",)
# what a run produced for people to read: continued by a resumed run, cleared by a new one
HISTORY_DIRS = ("traces", "logs", "tensorboard", "attempts", "evals")
HISTORY_FILES = ("metrics.jsonl", "curves.png", "recoveries.jsonl", "alarms.jsonl")
# what a resumed run moves to attempts/N/ (its traces and logs belong to a job that ended)
ARCHIVED = ("traces", "logs", "job.json", "result.json")
# keys of the job.json an earlier version (without the marker) wrote
_LEGACY_KEYS = {"run_dir", "hf_checkpoint", "num_rollout", "rollout_batch_size"}


class RunDirError(ValueError):
    """A run directory that cannot be used without risking someone's files; the message says why."""


def _is_legacy(p: Path) -> bool:
    job = read_small_json(p / "job.json")
    return job is not None and _LEGACY_KEYS <= set(job)


def _ours_by_name(p: Path) -> list[str]:
    """Entries of `p` with the names a run writes and clears."""
    names = set(LIVE_DIRS + LIVE_FILES + HISTORY_DIRS + HISTORY_FILES)
    return sorted(x.name + ("/" if x.is_dir() else "") for x in p.iterdir()
                  if x.name in names or any(x.match(g) for g in LIVE_GLOBS))


def inspect_run_dir(path: str | os.PathLike) -> str:
    """What `path` is, without changing anything: "new" (missing, empty, or holding none of the names a run
    writes), "ours" (marked) or "legacy" (a run directory of an earlier version). Raises RunDirError for a file,
    or an unmarked directory holding names a run would clear (logs/, traces/, metrics.jsonl, ...)."""
    p = Path(path)
    if not p.exists():
        return "new"
    if not p.is_dir():
        raise RunDirError(f"--run-dir {path}: is a file, not a directory")
    if (p / MARKER).is_file():
        return "ours"
    if _is_legacy(p):
        return "legacy"
    clash = _ours_by_name(p)
    if not clash:
        return "new"  # its files are not ours and a run never touches them
    others = len(list(p.iterdir())) - len(clash)
    raise RunDirError(
        f"--run-dir {path}: this directory is not a slime-actors run directory (no {MARKER} marker) and it holds "
        f"{', '.join(clash[:8])} -- names a run writes and clears" + (f" (and {others} other entries)" if others
                                                                      else "") +
        f". Nothing was changed. Give a new or empty directory, or one without those names (a run directory is "
        f"marked when a run creates it; marking this one by hand, {p / MARKER}, lets a run clear exactly those "
        f"names)")


def deleted_paths(path: str | os.PathLike) -> list[Path]:
    """Every path a new run in `path` would remove (for checking that no input or output of the job is there)."""
    p = Path(path)
    return [p / n for n in LIVE_DIRS + LIVE_FILES + HISTORY_DIRS + HISTORY_FILES]


def check_nothing_inside(run_dir: str | os.PathLike, named: dict[str, str | None]) -> None:
    """Refuse a flag whose path lies where a run clears its state (e.g. --save RUN/logs)."""
    doomed = [d.resolve() for d in deleted_paths(run_dir)]
    for flag, value in named.items():
        if not value or str(value).startswith(("tiny:", "smollm2:")):  # built-in models are no paths
            continue
        v = Path(str(value).split("{", 1)[0]).resolve()
        for d in doomed:
            if v == d or d in v.parents:
                raise RunDirError(f"{flag} {value}: inside {d}, which a run clears (run-directory state); "
                                  "put it elsewhere")


def _write_marker(p: Path) -> None:
    (p / MARKER).write_text(json.dumps({"created": time.time(), "by": "slime-actors", "pid": os.getpid()}) + "\n")


def _remove(p: Path) -> None:
    if p.is_symlink() or p.is_file():
        p.unlink(missing_ok=True)
    elif p.is_dir():
        shutil.rmtree(p)


def _clear(p: Path, names: tuple[str, ...], globs: tuple[str, ...] = ()) -> None:
    for n in names:
        _remove(p / n)
    for g in globs:
        for f in p.glob(g):
            _remove(f)


def _archive_attempt(p: Path) -> Path | None:
    """Move the previous attempt's traces, logs and job files to attempts/N/ (and copy its metrics); None when
    there was nothing to keep."""
    present = [n for n in ARCHIVED if (p / n).exists()]
    if not present:
        return None
    base = p / "attempts"
    base.mkdir(exist_ok=True)
    n = 1 + max((int(x.name) for x in base.iterdir() if x.name.isdigit()), default=0)
    dest = base / str(n)
    dest.mkdir()
    for name in present:
        os.replace(p / name, dest / name)
    if (p / "metrics.jsonl").exists():
        shutil.copy2(p / "metrics.jsonl", dest / "metrics.jsonl")  # as it was before the resumed run trims it
    return dest


def run_in_use(path: str | os.PathLike, now: float | None = None) -> str | None:
    """Why `path` is in use by a job that is running now (None: it is not): its head.json names a live slime-actors
    process on this host, or -- a head on another host -- its status.json says "running" and was written in the last
    15 s (the head rewrites it every second or so). A new job there would clear the running job's sockets, keys and
    buffer log under it. Reads only."""
    import socket
    p = Path(path)
    head = read_small_json(p / "head.json") or {}
    try:
        pid, host = int(head.get("pid") or 0), str(head.get("host") or "")
    except (ValueError, TypeError):
        pid, host = 0, ""
    stop = "stop it first (Ctrl-C where it runs) or give another --run-dir. Nothing was changed"
    if pid > 0 and host == socket.gethostname() and pid != os.getpid():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = ""
        if "slime_actors" in cmd or "slime-actors" in cmd:
            return f"--run-dir {path} is in use by a running job (its head: pid {pid} on this host); " + stop
    status = read_small_json(p / "status.json") or {}
    try:
        running, written = status.get("state") == "running", float(status.get("time") or 0)
    except (ValueError, TypeError):
        return None
    if running and host and host != socket.gethostname() and 0 <= (now or time.time()) - written < 15:
        return (f"--run-dir {path} is in use by a running job (its head on {host}, its status written "
                f"{(now or time.time()) - written:.0f} s ago); " + stop)
    return None


def unfinished_run(path: str | os.PathLike) -> str | None:
    """Why a new run in `path` would lose a previous run's training (None: it would not): that run did not finish
    (its status.json is not "finished": stopped, failed, or its head killed before it could say) and its rolling
    checkpoint (RUN_DIR/ckpt, with its marker) holds a complete checkpoint after at least one trained rollout. Reads
    only."""
    from .checkpoints import trained_checkpoint
    p = Path(path)
    roll = p / ROLLING_DIR
    if not (p / MARKER).is_file() or not (roll / ROLLING_MARKER).is_file():
        return None
    found = trained_checkpoint(roll)
    if found is None:
        return None
    ckpt, done = found
    status = read_small_json(p / "status.json") or {}
    state = status.get("state")
    if state == "finished":
        return None
    controller = status.get("controller")
    of = controller.get("num_rollout") if isinstance(controller, dict) else None
    how = {"stopped": str(status.get("failure") or "stopped"),
           "failed": "failed" + (f": {status.get('cause')}" if status.get("cause") else "")}.get(
        state or "", "ended without saying how (its head was killed, or the machine went down)")
    return (f"--run-dir {path} holds a run that did not finish -- {how} -- and its rolling checkpoint {ckpt} "
            f"(rollout {done}" + (f" of {of}" if of else "") + ") would be deleted by a new run. Nothing was "
            f"changed. To continue that run: add --load {roll}. To start over: delete {roll} (a new run clears "
            f"the rest of the old one), or give another --run-dir")


def join_run_dir(path: str | os.PathLike) -> Path:
    """For a node agent (another host's part of a job, which may start before the head): the run directory is
    checked as the head checks it, created and marked if new, and never cleared (the head does that)."""
    p = Path(path)
    state = inspect_run_dir(p)
    p.mkdir(parents=True, exist_ok=True)
    if state != "ours":
        _write_marker(p)
    return p


def prepare_run_dir(path: str | os.PathLike, resume: bool = False,
                    resume_from: str | os.PathLike | None = None) -> Path:
    """Make `path` ready for a job (call it only once every other check passed): create and mark it, then clear
    a previous run's live state -- and, unless resuming, its history; and the previous run's rolling checkpoint
    (RUN_DIR/ckpt, when it carries the rolling marker) unless the job resumes from it (`resume_from`). Raises
    RunDirError (nothing changed) for a directory that is not ours."""
    p = Path(path)
    state = inspect_run_dir(p)
    p.mkdir(parents=True, exist_ok=True)
    if state != "ours":
        _write_marker(p)
    if state == "new":
        return p
    roll = p / ROLLING_DIR
    if (roll / ROLLING_MARKER).is_file() and not (
            resume_from is not None and roll.resolve() in Path(resume_from).resolve().parents):
        _remove(roll)
    _clear(p, LIVE_DIRS + ("head.json", "status.json"), LIVE_GLOBS)
    if resume:
        _archive_attempt(p)
    else:
        _clear(p, HISTORY_DIRS + HISTORY_FILES + LIVE_FILES)
    return p
