"""Logging through structlog, and the one console renderer of a process.

    from slime_actors.log import get_logger, setup_logging, CONSOLE
    setup_logging(run_dir="runs/x", name="reward/0")   # once per process
    log = get_logger(actor="reward/0"); log.info("scored", n=8)
    log.info("peer stopped", peer="x", console=False)  # into the JSON log only (on the console at debug level)
    CONSOLE.write("a line")                             # plain text above the status/progress line
    CONSOLE.footer("progress", "rl steps 3/60 ...")     # the last line of a terminal, redrawn in place

Two destinations. RUN_DIR/logs/<actor>.jsonl gets every event of level info and up (debug too at --log-level
debug) as JSON, unchanged by the console's level. The console (stderr) gets readable lines of level
--log-level and up (default: $SLIME_ACTORS_LOG_LEVEL, else info); events logged with `console=False` (routine
book-keeping: actors starting, registering, peers stopping) only at debug.

Everything a process shows on its console goes through CONSOLE, so log lines, status lines and the progress bar
never interleave: on a terminal the footer (status and progress, one line) stays at the bottom, and a line written
above it clears it and draws it again; when stderr is not a terminal (a file, a pipe, CI) there is no footer and
no progress bar -- only lines -- and other libraries' progress bars (Hugging Face's) are turned off too.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
from pathlib import Path

import structlog

from .env import LOG_LEVEL

_lock = threading.Lock()
_file = None
_configured = False

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Console:
    """The one writer of this process's stderr: lines, and on a terminal a footer line kept at the bottom (named
    parts -- the job's status, the progress bar -- joined with ' | ')."""

    def __init__(self):
        self._lock = threading.RLock()
        self._parts: dict[str, str] = {}
        self._shown = False      # a footer is on the screen (the cursor is at its end)

    @property
    def interactive(self) -> bool:
        """stderr is a terminal: footers and progress bars are drawn."""
        return _is_tty(sys.stderr)

    def write(self, text: str, stream=None) -> None:
        """Lines of text above the footer (stderr unless `stream`)."""
        stream = stream if stream is not None else sys.stderr
        with self._lock:
            try:
                if self._shown and stream is sys.stderr:
                    stream.write("\r\033[K")
                    self._shown = False
                tq = sys.modules.get("tqdm")   # a tqdm bar of some library: let it clear and redraw itself
                bars = getattr(getattr(tq, "tqdm", None), "_instances", None) if tq is not None else None
                if bars:
                    tq.tqdm.write(text, file=stream)
                else:
                    stream.write(text + "\n")
                    stream.flush()
                if stream is sys.stderr:
                    self._draw()
            except (ValueError, OSError):  # a closed or broken stream: the JSON file still has log lines
                pass

    def footer(self, part: str, text: str | None) -> None:
        """Set (or with None remove) one part of the footer; drawn only on a terminal."""
        with self._lock:
            if text is None:
                self._parts.pop(part, None)
            else:
                self._parts[part] = text
            try:
                self._draw()
            except (ValueError, OSError):
                pass

    def end_footer(self, keep: bool = True) -> None:
        """The footer becomes an ordinary line (keep) or is erased; no footer afterwards."""
        with self._lock:
            try:
                if self._shown:
                    sys.stderr.write("\n" if keep else "\r\033[K")
                    sys.stderr.flush()
            except (ValueError, OSError):
                pass
            self._shown = False
            self._parts.clear()

    def _draw(self) -> None:
        stream = sys.stderr
        if not self._parts or not _is_tty(stream):
            if self._shown and not self._parts:
                stream.write("\r\033[K")
                stream.flush()
                self._shown = False
            return
        width = shutil.get_terminal_size((120, 20)).columns - 1
        line = " | ".join(self._parts.values())
        if len(line) > width:
            line = line[: max(1, width - 1)] + "…"
        stream.write("\r\033[K" + line)
        stream.flush()
        self._shown = True


CONSOLE = Console()


def console_write(text: str, stream=None) -> None:
    """Lines on the console (stderr) above the status/progress line (CONSOLE.write)."""
    CONSOLE.write(text, stream)


def progress_line(label: str, done: int, total: int, seconds_per_step: float | None, extra: dict | None = None,
                  width: int = 20) -> str:
    """`label 3/60 ▕██········▏  5% 1.9 s/step reward 0.031` for the footer."""
    total = max(total, 1)
    frac = min(max(done / total, 0.0), 1.0)
    filled = int(round(frac * width))
    bar = "▕" + "█" * filled + "·" * (width - filled) + "▏"
    rate = "" if seconds_per_step is None else (f" {seconds_per_step:.1f} s/step" if seconds_per_step >= 1
                                                 else f" {1 / max(seconds_per_step, 1e-9):.1f} step/s")
    more = "".join(f" {k} {v}" for k, v in (extra or {}).items() if v is not None)
    return f"{label} {done}/{total} {bar} {frac * 100:3.0f}%{rate}{more}"


class _Tee:
    """Final processor: writes JSON to the run's log file and returns a console line (or drops the event there)."""

    def __init__(self, console: bool, colors: bool, console_level: int):
        self.console = console
        self.console_level = console_level
        self.render = structlog.dev.ConsoleRenderer(colors=colors, pad_event_to=32)

    def __call__(self, logger, method_name, event_dict):
        show = event_dict.pop("console", True)
        if _file is not None:
            line = json.dumps(event_dict, default=str)
            with _lock:
                try:
                    _file.write(line + "\n")
                    _file.flush()
                except (OSError, ValueError):
                    pass
        level = LEVELS.get(str(event_dict.get("level", "info")).lower(), 20)
        if not self.console or level < self.console_level or (show is False and self.console_level > 10):
            raise structlog.DropEvent
        return self.render(logger, method_name, dict(event_dict))


class _StderrLogger:
    """Writes to whatever sys.stderr is *now* (test runners and daemons swap it after set-up), through CONSOLE."""

    def msg(self, message: str) -> None:
        CONSOLE.write(message)

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg


class _StderrLoggerFactory:
    def __call__(self, *args) -> _StderrLogger:
        return _StderrLogger()


def quiet_library_progress_bars() -> None:
    """When stderr is not a terminal, turn off other libraries' progress bars (Hugging Face's downloads and shard
    writes, tqdm's) in this process and the processes it starts: they draw with carriage returns, which a log file
    shows as one endless line. The job's launcher calls this once."""
    if not _is_tty(sys.stderr):
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")


def console_level(level: str | None = None) -> str:
    """The console's level: `level`, else $SLIME_ACTORS_LOG_LEVEL, else info; ValueError naming a bad one."""
    name = (level or LOG_LEVEL.get() or "info").strip().lower()
    if name == "warn":
        name = "warning"
    if name not in LEVELS:
        raise ValueError(f"log level {name!r}: expected one of {', '.join(LEVELS)} "
                         f"(--log-level or {LOG_LEVEL.name})")
    return name


def setup_logging(run_dir: str | os.PathLike | None = None, name: str | None = None, level: str | None = None,
                  console: bool = True) -> None:
    """Configure structlog for this process. Safe to call again (e.g. once the actor's name is known)."""
    global _file, _configured
    try:
        level = console_level(level)
    except ValueError as exc:   # a bad $SLIME_ACTORS_LOG_LEVEL must not stop an actor: say so, use info
        print(f"warning: {exc}; using info", file=sys.stderr)
        level = "info"
    if run_dir is not None:
        d = Path(run_dir) / "logs"
        d.mkdir(parents=True, exist_ok=True)
        fname = (name or f"process-{os.getpid()}").replace("/", "-") + ".jsonl"
        with _lock:
            if _file is not None:
                _file.close()
            _file = open(d / fname, "a", buffering=1)
    colors = _is_tty(sys.stderr) and not os.environ.get("NO_COLOR")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=False),
            structlog.processors.format_exc_info,
            _Tee(console, colors, LEVELS[level]),
        ],
        # the JSON file keeps info and up whatever the console shows (debug too when asked for)
        wrapper_class=structlog.make_filtering_bound_logger(min(LEVELS[level], LEVELS["info"])),
        logger_factory=_StderrLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    _configured = True


def get_logger(**bind):
    if not _configured:
        setup_logging()
    return structlog.get_logger().bind(**bind)
