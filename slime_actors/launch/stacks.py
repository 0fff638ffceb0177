"""Where a hung actor is stuck: its Python stack, dumped on request, read back from its log.

Every actor process registers `faulthandler` for SIGUSR1 at start (`register`): on that signal the interpreter writes
every thread's Python stack to the process's stderr -- from the C signal handler, so it is written even while the
actor's main thread is blocked in a call that never returns to Python (a `time.sleep`, a socket read, a C
extension's loop). The supervisor (launch/local.py) asks for it before it kills an actor whose heartbeats stopped
(`ask`), reads the dump from the actor's log (`read`), logs where the main thread was and stops the job when a
restarted actor hangs at the same place again: a blocking call in async code (the usual cause) hangs every
incarnation the same way, and restarting it for ever only hides it.

`slime-actors stacks RUN [--actor NAME] [--all-threads] [--native]` does the same for a person: what each actor of a
running job is doing now, without stopping it (docs/debugging.md, *A process that stops answering*). It asks by
SIGUSR2, whose handler (`register`) runs in Python, in the main thread, between two bytecodes: it reads every
thread's frames with the GIL held (`live_dump`) and writes them in faulthandler's format. faulthandler's dump is
written from the C signal handler while the other threads run on, and it can crash the process when a thread starts
or ends meanwhile (CPython gh-116008: a SIGSEGV part-way through the dump; it ended a buffer in this project's test
suite) -- acceptable for an actor about to be killed, not for a job that is to go on. The cost: an actor whose main
thread is in a call that does not return to Python answers SIGUSR2 only once it returns; `stacks --native` asks
faulthandler then.

The format read is CPython's (3.11-3.14): a block per thread, the thread that took the signal -- the main thread: the
kernel gives a signal sent to a process to its main thread unless that thread blocks it -- headed
``Current thread 0x... (most recent call first):``, then one ``  File "PATH", line N in FUNC`` line per frame.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..json_files import read_small_json

SIGNAL = signal.SIGUSR1        # faulthandler's dump, from the C handler: the supervisor's, before it kills
LIVE_SIGNAL = signal.SIGUSR2   # the dump from Python in the main thread (`live_dump`): `slime-actors stacks`'
MAX_DEPTH = 100                # frames a thread (faulthandler's limit too)
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
    """In an actor process (its main thread): every thread's stack to stderr on SIGUSR1 (faulthandler) and on SIGUSR2
    (`live_dump`), kept for the process's life."""
    try:
        faulthandler.register(SIGNAL, file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError, RuntimeError):   # no fd 2 (a test's captured stderr): no dumps
        pass
    try:
        signal.signal(LIVE_SIGNAL, _dump_live)
    except (AttributeError, ValueError, OSError):   # (not the main thread, or no SIGUSR2 here)
        pass


def live_dump(current) -> str:
    """Every thread's stack in faulthandler's format -- a block per thread, ``Thread 0x...`` for the others and
    ``Current thread 0x...`` last for this one, whose innermost frame is `current` --, read from Python with the GIL
    held (`sys._current_frames`): no thread's frames change while they are read."""
    me = threading.get_ident()

    def block(head: str, ident: int, frame) -> str:
        lines = [f"{head} 0x{ident:016x} (most recent call first):"]
        depth = 0
        while frame is not None and depth < MAX_DEPTH:
            code = frame.f_code
            lines.append(f'  File "{code.co_filename}", line {frame.f_lineno or 0} in {code.co_name}')
            frame, depth = frame.f_back, depth + 1
        if frame is not None:
            lines.append("  ...")
        return "\n".join(lines)
    out = [block("Thread", ident, frame) for ident, frame in sys._current_frames().items() if ident != me]
    out.append(block("Current thread", me, current))
    return "\n\n".join(out) + "\n"


def _dump_live(signum, frame) -> None:
    """SIGUSR2's handler: `live_dump` of the interrupted frame (not this handler's), to fd 2 in one write."""
    try:
        os.write(2, ("\n" + live_dump(frame)).encode(errors="replace"))
    except Exception:  # noqa: BLE001 - (a dump that cannot be made or written must not disturb the actor)
        pass


def _tgkill() -> Callable[[int, int, int], int] | None:
    """glibc's `tgkill(tgid, tid, sig)` (2.30 and later), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = getattr(ctypes.CDLL(None), "tgkill")
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_TGKILL = _tgkill()


def ask(pid: int, sig: int = SIGNAL) -> bool:
    """Ask process `pid` (not its process group: only the actor registered the handler) for its stacks: `sig` is
    SIGNAL (faulthandler's dump) or LIVE_SIGNAL (`live_dump`).

    The signal goes to the process's main thread (Linux: `tgkill(pid, pid, sig)`; the main thread's id is the
    process's): faulthandler heads the dump with the thread that runs its handler ("Current thread"), and that is
    the one `read` takes for the main thread (a Python handler runs in the main thread whichever thread took the
    signal). Sent to the process (`kill`), the kernel may hand it to any thread that does not block it -- a worker
    thread of a pool (its stack read as the main thread's), or a C library's thread with no Python state (a dump
    with no "Current thread": read as no stack at all) -- when the main thread has a signal pending already and is
    not on a CPU. Elsewhere (no tgkill) it is `kill`."""
    try:
        if _TGKILL is not None:
            return _TGKILL(pid, pid, int(sig)) == 0   # (-1: no such process, or not ours to signal)
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (Linux: its SigCgt mask in /proc; elsewhere assumed): SIGUSR1
    and SIGUSR2 end a process that has none -- an actor started by an older slime-actors, say."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return not sys.platform.startswith("linux")
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False


def _lines(path: Path, offset: int) -> list[str]:
    """The lines written to `path` after byte `offset` (at most 4 MiB of them: a dump is a few KB)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(4 << 20).decode(errors="replace").splitlines()
    except OSError:
        return []


def read(path: Path, offset: int = 0) -> list[Frame] | None:
    """The main thread's frames, innermost first, from the last dump written to `path` after byte `offset`; None when
    there is none (the process did not answer: not in Python, stopped, or the log is gone)."""
    lines = _lines(path, offset)
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
    """Whether a main thread's stack read so far reaches its outermost frame: a script's `<module>`, or -- a module
    run with `python -m`, as every actor is -- runpy's `_run_module_as_main` below the module's `<module>`."""
    if not frames:
        return False
    last = frames[-1].func
    return last == "<module>" or (last == "_run_module_as_main" and any(f.func == "<module>" for f in frames))


def idle_loop(frames: list[Frame]) -> bool:
    """Whether the main thread is waiting inside its event loop (no Python frame of a handler above the loop's run)."""
    top = frames[0] if frames else None
    return top is not None and (top.path.endswith(("asyncio/runners.py", "asyncio/base_events.py"))
                                or top.path.endswith("uvloop/__init__.py"))


def is_actor(pid: int, name: str) -> bool:
    """Whether process `pid` is actor `name`'s (`python -m slime_actors.launch.actor ROLE INDEX`, launch/local.py) --
    not a process that got its pid since."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    role, _, index = name.partition("/")
    return "slime_actors.launch.actor" in argv and argv[-3:-1] == [role, index]


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


def dump_text(path: Path, offset: int = 0) -> str:
    """Every thread's block of the last dump written to `path` after byte `offset` ("" when there is none)."""
    lines = _lines(path, offset)
    heads = [i for i, ln in enumerate(lines) if _HEAD.match(ln)]
    if not heads:
        return ""
    first = heads[0]   # the dump's first thread block; the dump ends after the main thread's ("Current thread")
    last = max((i for i in heads if lines[i].startswith("Current thread")), default=heads[-1])
    end = last + 1
    while end < len(lines) and _FRAME.match(lines[end]):
        end += 1
    return "\n".join(lines[first:end])


# ------------------------------------------------------------------------------------------ slime-actors stacks

def add_stacks_command(sub) -> None:
    p = sub.add_parser("stacks", help="what each actor of a running job is doing now: its Python stack",
                       description="Ask each actor process of a running job (on this host) for its Python stacks "
                                   "(SIGUSR1; the job goes on) and print its main thread's.")
    p.add_argument("run", help="run directory of a running job")
    p.add_argument("--actor", action="append", default=None, metavar="NAME",
                   help="only this actor (role/index, e.g. rollout/0; again for more)")
    p.add_argument("--all-threads", action="store_true", help="every thread's stack, not only the main thread's")
    p.add_argument("--wait", type=float, default=10.0,
                   help="seconds to wait at most for each actor's answer (one that answers is shown at once)")
    p.add_argument("--native", action="store_true",
                   help="ask for faulthandler's dump (SIGUSR1), written even while an actor's main thread is in a "
                        "call that does not return to Python; it can crash a process whose threads start or end "
                        "meanwhile (CPython gh-116008). Default: the dump from Python (SIGUSR2), safe to ask")
    p.set_defaults(fn=cmd_stacks)


def cmd_stacks(args) -> int:
    run = Path(args.run)
    status = read_small_json(run / "status.json")
    if status is None:
        print(f"slime-actors stacks: {run}: no readable status.json (missing, not a JSON object, or too large); is "
              "it the run directory of a job?", file=sys.stderr)
        return 2
    if status.get("state") != "running":
        print(f"slime-actors stacks: the job in {run} is not running (its status: {status.get('state')})",
              file=sys.stderr)
        return 1
    procs = status.get("processes")
    procs = {n: p for n, p in procs.items() if isinstance(p, dict)} if isinstance(procs, dict) else {}
    if not procs:
        print(f"slime-actors stacks: the job in {run} lists no actor processes of its launcher (under torchrun the "
              "ranks are torchrun's: `kill -USR2 PID` writes a rank's stacks to its stderr)",
              file=sys.stderr)
        return 2
    names = args.actor or sorted(procs)
    unknown = [n for n in names if n not in procs]
    if unknown:
        print(f"slime-actors stacks: no process {', '.join(unknown)} on this host's launcher (it has: "
              f"{', '.join(sorted(procs)) or 'none'})", file=sys.stderr)
        return 2
    here = socket.gethostname()
    code = 0
    for name in names:
        pid = procs[name].get("pid")
        actors = status.get("actors")
        actor = actors.get(name) if isinstance(actors, dict) else None
        host = actor.get("host") if isinstance(actor, dict) else None
        log = run / "logs" / (name.replace("/", "-") + ".out")
        if host and host != here:
            print(f"== {name}: on {host}, not this host ({here}); run this there\n")
            continue
        mark = size(log)
        sig = SIGNAL if args.native else LIVE_SIGNAL
        # (SIGUSR1 and SIGUSR2 end a process that did not register for them: only a live process of this actor with
        # a handler for the signal is asked)
        if not isinstance(pid, int) or pid <= 0 or not is_actor(pid, name):
            print(f"== {name}: not running (pid {pid} is not this actor's process now)\n")
            code = 1
            continue
        if not catches(pid, sig):
            print(f"== {name} (pid {pid}): has no handler for {signal.Signals(sig).name} (started by another version "
                  f"of slime-actors?); not asked\n")
            code = 1
            continue
        if not ask(pid, sig):
            print(f"== {name}: not running (pid {pid} is not this actor's process now)\n")
            code = 1
            continue
        t0 = time.monotonic()
        frames = None
        while time.monotonic() - t0 < args.wait:
            time.sleep(0.05)
            frames = read(log, mark)
            if complete(frames):
                break
        if not frames:
            how = "stopped, or not in Python" if args.native else \
                "its main thread is in a call that has not returned to Python, or it is stopped; --native asks " \
                "for the dump written even then"
            print(f"== {name} (pid {pid}): no Python stack within {args.wait:g} s ({how}); its log: {log}\n")
            code = 1
            continue
        if args.all_threads:
            print(f"== {name} (pid {pid}), every thread, innermost first (the main thread is the \"Current\" one):")
            print(dump_text(log, mark))
        else:
            idle = " -- idle in its event loop (waiting for messages; --all-threads shows its threads' work)" \
                if idle_loop(frames) else ""
            print(f"== {name} (pid {pid}), main thread, innermost first{idle}:")
            print(shown(frames, n=len(frames)))
        print()
    return code
