"""Where a hung actor is stuck: its Python stack, dumped on request, read back from its log.

Every actor process registers `faulthandler` for SIGUSR1 at start (`register`): on that signal the interpreter writes
every thread's Python stack to the process's stderr -- from the C signal handler, so it is written even while the
actor's main thread is blocked in a call that never returns to Python (a `time.sleep`, a socket read, a C
extension's loop). The supervisor (launch/local.py) asks for it before it kills an actor whose heartbeats stopped
(`ask`), reads the dump from the actor's log (`read`), logs where the main thread was and stops the job when a
restarted actor hangs at the same place again: a blocking call in async code (the usual cause) hangs every
incarnation the same way, and restarting it for ever only hides it.

The format read is CPython's (3.11-3.14): a block per thread, the thread that took the signal -- the main thread: the
kernel gives a signal sent to a process to its main thread unless that thread blocks it -- headed
``Current thread 0x... (most recent call first):``, then one ``  File "PATH", line N in FUNC`` line per frame.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

SIGNAL = signal.SIGUSR1
WAIT_S = 1.0          # how long the supervisor waits for the dump to reach the log before it kills
_FRAME = re.compile(r'^\s+File "(?P<path>.*)", line (?P<line>\d+) in (?P<func>\S+)')
_HEAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):")


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    func: str

    def __str__(self) -> str:
        return f'File "{self.path}", line {self.line}, in {self.func}'

    @property
    def function(self) -> tuple[str, str]:
        """The place a hang is judged by: the file and function (a busy loop is caught on any of its lines)."""
        return self.path, self.func


def register() -> None:
    """In an actor process: dump every thread's stack to stderr on SIGUSR1 (kept for the process's life)."""
    try:
        faulthandler.register(SIGNAL, file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError, RuntimeError):   # no fd 2 (a test's captured stderr): no dumps
        pass


def ask(pid: int) -> bool:
    """Ask process `pid` (not its process group: only the actor registered the handler) for its stacks."""
    try:
        os.kill(pid, SIGNAL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def read(path: Path, offset: int = 0) -> list[Frame] | None:
    """The main thread's frames, innermost first, from the last dump written to `path` after byte `offset`; None when
    there is none (the process did not answer: not in Python, stopped, or the log is gone)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read(4 << 20).decode(errors="replace")
    except OSError:
        return None
    lines = text.splitlines()
    start = None
    for i, ln in enumerate(lines):
        if ln.startswith("Current thread 0x") and _HEAD.match(ln):
            start = i
    if start is None:
        return None
    frames: list[Frame] = []
    for ln in lines[start + 1:]:
        m = _FRAME.match(ln)
        if not m:
            break
        frames.append(Frame(m["path"], int(m["line"]), m["func"]))
    return frames


def complete(frames: list[Frame] | None) -> bool:
    """Whether a main thread's stack read so far reaches its outermost frame (an actor's is its `<module>`)."""
    return bool(frames) and frames[-1].func == "<module>"


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def shown(frames: list[Frame], n: int = 8) -> str:
    """The innermost `n` frames, one per line, indented (the traceback's wording, innermost first)."""
    out = [f"    {fr}" for fr in frames[:n]]
    if len(frames) > n:
        out.append(f"    ... {len(frames) - n} outer frames (the actor's log has them)")
    return "\n".join(out)
