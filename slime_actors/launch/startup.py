"""Start-up failures: why an actor did not start, and whether starting it again can change that.

An actor process reports how its start went (slime_actors.launch.actor), in RUN_DIR/logs/ROLE-INDEX.start.json:

    {"pid": 4711, "state": "ready"}                                    on_start finished: the actor serves
    {"pid": 4711, "state": "failed", "cause": "...", "permanent": true}  it did not; `cause` is one line

and exits with EXIT_PERMANENT (78, EX_CONFIG of sysexits.h) when the cause is one no restart can change: a bad flag
or config value (ConfigError), an import error, a missing file or model, a model directory whose config.json is not
JSON, `--device cuda` where there is no GPU, a GPU index that does not exist. Code that knows such a cause raises
StartupError (config.py: the actors raise it too); for errors from other code (transformers, torch, an engine's output) `cause_of` reads the exception
and `permanent` matches the message against what a restart cannot change.

The supervisor (launch/local.py) applies the start-up rule to an actor that dies before it ever became ready:
a permanent cause stops the job at once; otherwise the actor is started again, and a second start-up failure with
the same cause (numbers aside: ports, pids, sizes) -- or a third start-up failure in a row, whatever the causes --
stops the job. Either way the cause is printed once, last, and the run's status.json says it. An actor that was
ready and died later is restarted under the restart intensity rule (topology.RestartPolicy).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError, StartupError
from ..json_files import read_small_json

EXIT_PERMANENT = 78          # sysexits.h EX_CONFIG: never restarted
MAX_START_FAILURES = 3       # start-up failures in a row (never ready in between) that stop the job, any causes


@dataclass(frozen=True)
class Cause:
    text: str                # one line: the root cause as a person reads it
    permanent: bool          # no restart can change it

    @property
    def key(self) -> str:
        """The cause with its numbers taken out (ports, pids, addresses, sizes): equal keys = the same cause."""
        return re.sub(r"0x[0-9a-fA-F]+|\d+(\.\d+)?", "#", self.text)


# What a restart cannot change, in the messages of Python, torch, transformers, argparse and SGLang.
_PERMANENT = [
    r"\b(ModuleNotFoundError|ImportError|SyntaxError|IndentationError|ConfigError|SGLangFlagError)\b",
    r"\bNo module named\b",
    # devices
    r"invalid device ordinal", r"no CUDA GPUs are available", r"Torch not compiled with CUDA",
    r"Found no NVIDIA driver", r"CUDA driver version is insufficient", r"no CUDA[- ]capable device",
    r"CUDA is not available", r"no CUDA device", r"no GPU is visible", r"needs a GPU",
    # files and models
    r"\b(FileNotFoundError|NotADirectoryError|IsADirectoryError|PermissionError)\b", r"No such file or directory",
    r"does not exist", r"does not appear to have a file named", r"is not a local folder and is not a valid model",
    r"Repository Not Found", r"not a valid JSON", r"\bJSONDecodeError\b", r"Unrecognized model",
    r"does not recognize this architecture",
    r"no config\.json",
    # command lines
    r"unrecognized arguments", r"the following arguments are required", r"invalid choice", r"\berror: argument\b",
    r"is not a launch flag", r"cannot be passed through",
]
_PERMANENT_RE = re.compile("|".join(f"(?:{p})" for p in _PERMANENT), re.IGNORECASE)
# the line of a traceback that names the exception ("pkg.mod.SomeError: message"), or argparse's "prog: error: ..."
_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Exit|Interrupt)|KeyboardInterrupt)"
                       r"(?::\s*(.*))?$")
_ARGPARSE_LINE = re.compile(r"^[\w./ -]+: error: (.+)$")
_LOG_PREFIX = re.compile(r"^\S+ \[\s*\w+\s*\] ")   # a structlog console line's time and level


def permanent(text: str) -> bool:
    """Whether an error message names a cause no restart can change."""
    return bool(_PERMANENT_RE.search(text))


def _one_line(text: str, limit: int = 500) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def cause_from_output(lines: list[str]) -> Cause | None:
    """The root cause in a process's last output lines: the last exception line of a traceback (the one that says
    what went wrong, not the frames above it), else argparse's `error:` line. None when neither is there."""
    found = None
    for raw in lines:
        line = _LOG_PREFIX.sub("", raw.strip())
        if not line or line.startswith(("File ", "Traceback", "^", "~")):
            continue
        if _EXC_LINE.match(line) or _ARGPARSE_LINE.match(line):
            found = line
    if found is None:
        return None
    return Cause(_one_line(found), permanent(found))


def cause_of(exc: BaseException) -> Cause:
    """The root cause of an exception an actor's start raised. An engine that did not start (EngineStartError)
    gives the cause its own output names."""
    lines = [ln for ln in getattr(exc, "last_lines", None) or [] if ln.strip()]
    if lines and not getattr(exc, "timed_out", False):   # backends.engine_process.EngineStartError: the engine's own last words
        inner = cause_from_output(lines)
        if inner is None:   # (an uncaught SystemExit("...") prints its message alone)
            inner = Cause(_one_line(lines[-1]), permanent(lines[-1]))
        return Cause(_one_line(f"engine: {inner.text}"), inner.permanent)
    first = str(exc).splitlines()[0] if str(exc) else ""
    text = _one_line(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)
    if isinstance(exc, (StartupError, ConfigError, ImportError, SyntaxError, FileNotFoundError, NotADirectoryError,
                        IsADirectoryError, PermissionError)):
        return Cause(text, True)
    if isinstance(exc, SystemExit):   # SystemExit("message"): a program's own refusal to go on
        text = _one_line(first or f"exit code {exc.code}")
    return Cause(text, permanent(text))


# -- the report an actor process leaves (launch/actor.py writes it, launch/local.py reads it) ---------------------

def report_path(run_dir: str | os.PathLike, name: str) -> Path:
    return Path(run_dir) / "logs" / f"{name.replace('/', '-')}.start.json"


def write_report(run_dir: str | os.PathLike, name: str, state: str, cause: Cause | None = None) -> None:
    """Record this process's start: "ready", or "failed" with its cause. Never raises (a report that cannot be
    written leaves the supervisor reading the actor's output instead)."""
    body: dict = {"pid": os.getpid(), "state": state}
    if state == "ready":   # where its start-up went (slime_actors/startup_timeline.py: the controller's start-up breakdown)
        import time

        from .. import startup_timeline as timeline
        body.update(ready_at=time.time(), times=timeline.snapshot())
    if cause is not None:
        body.update(cause=cause.text, permanent=cause.permanent)
    path = report_path(run_dir, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, path)
    except OSError:
        pass


def read_report(run_dir: str | os.PathLike, name: str, pid: int) -> dict | None:
    """The report of process `pid` (an older process's report, or none: None)."""
    body = read_small_json(report_path(run_dir, name))
    return body if body is not None and body.get("pid") == pid else None
