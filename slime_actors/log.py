"""Logging through structlog: readable lines on the console, JSON lines in RUN_DIR/logs/<actor>.jsonl.

    from slime_actors.log import get_logger, setup_logging
    setup_logging(run_dir="runs/x", name="reward/0")   # once per process
    log = get_logger(actor="reward/0"); log.info("scored", n=8)
    console_write("a line above the progress bar")     # plain console text that leaves a tqdm bar intact
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path

import structlog

from .env import LOG_LEVEL

_lock = threading.Lock()
_file = None
_configured = False

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class _Tee:
    """Final processor: writes JSON to the run's log file and returns a console line."""

    def __init__(self, console: bool, colors: bool):
        self.console = console
        self.render = structlog.dev.ConsoleRenderer(colors=colors, pad_event_to=32)

    def __call__(self, logger, method_name, event_dict):
        if _file is not None:
            line = json.dumps(event_dict, default=str)
            with _lock:
                try:
                    _file.write(line + "\n")
                    _file.flush()
                except (OSError, ValueError):
                    pass
        if not self.console:
            raise structlog.DropEvent
        return self.render(logger, method_name, dict(event_dict))


def console_write(text: str, stream=None) -> None:
    """Lines on the console (stderr) that leave a progress bar of this process intact: with a tqdm bar showing,
    through tqdm.write (the bar is cleared, the text written, the bar drawn again below it)."""
    stream = stream if stream is not None else sys.stderr
    tq = sys.modules.get("tqdm")
    try:
        bars = getattr(getattr(tq, "tqdm", None), "_instances", None) if tq is not None else None
        if bars:
            tq.tqdm.write(text, file=stream)
            return
        stream.write(text + "\n")
        stream.flush()
    except (ValueError, OSError):  # a closed or broken stream: the JSON file still has log lines
        pass


class _StderrLogger:
    """Writes to whatever sys.stderr is *now* (test runners and daemons swap it after set-up)."""

    def msg(self, message: str) -> None:
        console_write(message, sys.stderr)

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg


class _StderrLoggerFactory:
    def __call__(self, *args) -> _StderrLogger:
        return _StderrLogger()


def setup_logging(run_dir: str | os.PathLike | None = None, name: str | None = None, level: str | None = None,
                  console: bool = True) -> None:
    """Configure structlog for this process. Safe to call again (e.g. once the actor's name is known)."""
    global _file, _configured
    level = (level or LOG_LEVEL.get()).lower()
    if run_dir is not None:
        d = Path(run_dir) / "logs"
        d.mkdir(parents=True, exist_ok=True)
        fname = (name or f"process-{os.getpid()}").replace("/", "-") + ".jsonl"
        with _lock:
            if _file is not None:
                _file.close()
            _file = open(d / fname, "a", buffering=1)
    colors = sys.stderr.isatty() and not os.environ.get("NO_COLOR")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=False),
            structlog.processors.format_exc_info,
            _Tee(console, colors),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS.get(level, 20)),
        logger_factory=_StderrLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    _configured = True


def get_logger(**bind):
    if not _configured:
        setup_logging()
    return structlog.get_logger().bind(**bind)
