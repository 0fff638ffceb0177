"""Grading with a hard deadline from any thread: math-verify (sympy) runs in a small pool of child processes.

math-verify bounds its own work with signal.alarm, which only works in a process's main thread; elsewhere (a reward
worker's threads, a trainer's reward callback) it would run unbounded, and a response such as `\\boxed{9^{9^{9^9}}}`
stalls it for good. So every math-verify call goes to a child process (`_child_main` below; started on first use,
kept warm). Each item has its own deadline, counted from when a process takes it: an item
not answered by then is killed with its process (a fresh one replaces it), scores 0 and is counted as timed out;
an item math-verify itself gives up on (its alarms work in the child's main thread) is counted the same way.

    pool = grading_pool()                                         # this process's pool
    pool.verify([r"3\\sqrt{2}"], r"\\sqrt{18}", "boxed", timeout=5.0)   # {"score": 1.0, "timed_out": False}
    await pool.averify(...)                                       # the same from an event loop
    grading_stats()                                               # {"calls", "timeouts", "restarts", "crashes"}

Requests and replies are msgpack maps in length-prefixed frames over the child's stdin/stdout (no pickle).
A child that dies mid-item raises GradingError (the reward worker reports the sample as failed, and it is retried).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import select
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack

from ..env import GRADING_PARENT
from ..config import default_of

__all__ = ["GradingPool", "GradingError", "grading_pool", "grading_stats", "close_grading_pool", "DEFAULT_TIMEOUT",
           "DEFAULT_PROCESSES"]

DEFAULT_TIMEOUT: float = default_of("math_grading_timeout")
DEFAULT_PROCESSES: int = default_of("math_grading_processes")
STARTUP_TIMEOUT = 120.0     # a child's start (imports sympy and math-verify): not part of any item's deadline
_LEN = struct.Struct(">I")
_CHILD = "import sys; from slime_actors.rewards.grading import _child_main; sys.exit(_child_main())"


class GradingError(RuntimeError):
    """A grading process failed (it died, or could not start); the item was not graded."""


class _Deadline(Exception):
    pass


# ------------------------------------------------------------------------------------------------ the parent side
class _Child:
    """One grading process and its pipes; used by one pool thread at a time."""

    def __init__(self):
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])     # the directory that holds the slime_actors package
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env[GRADING_PARENT.name] = str(os.getpid())
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, close_fds=True)
        self.fd = self.proc.stdout.fileno()
        try:
            ready = self._read(time.monotonic() + STARTUP_TIMEOUT)
        except _Deadline:
            self.kill()
            raise GradingError(f"a grading process did not start within {STARTUP_TIMEOUT:.0f} s") from None
        except GradingError as exc:
            self.kill()
            raise GradingError(f"a grading process did not start: {exc}") from None
        if ready.get("ready") is not True:
            self.kill()
            raise GradingError(f"a grading process did not start: {ready.get('error', ready)}")

    def ask(self, request: dict, deadline: float) -> dict:
        data = msgpack.packb(request, use_bin_type=True)
        try:
            self.proc.stdin.write(_LEN.pack(len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise GradingError(f"the grading process (pid {self.proc.pid}) is gone: {exc}") from None
        return self._read(deadline)

    def _read(self, deadline: float) -> dict:
        head = self._read_exact(_LEN.size, deadline)
        return msgpack.unpackb(self._read_exact(_LEN.unpack(head)[0], deadline), raw=False)

    def _read_exact(self, n: int, deadline: float) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Deadline
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                raise _Deadline
            chunk = os.read(self.fd, n - len(buf))
            if not chunk:
                code = self.proc.poll()
                raise GradingError(f"the grading process (pid {self.proc.pid}) exited"
                                   + (f" with code {code}" if code is not None else ""))
            buf += chunk
        return bytes(buf)

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class GradingPool:
    """`processes` threads, each owning one grading process (started when the thread first needs it)."""

    def __init__(self, processes: int = DEFAULT_PROCESSES):
        if processes < 1:
            raise ValueError(f"a grading pool needs at least 1 process, got {processes}")
        self.processes = processes
        self._executor = ThreadPoolExecutor(processes, thread_name_prefix="grading")
        self._local = threading.local()
        self._children: set[_Child] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.stats = {"calls": 0, "timeouts": 0, "restarts": 0, "crashes": 0}

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _child(self) -> _Child:
        c = getattr(self._local, "child", None)
        if c is None or c.proc.poll() is not None:
            if c is not None:
                self._drop(c)
            c = _Child()
            with self._lock:
                if self._closed:
                    c.kill()
                    raise GradingError("the grading pool is closed")
                self._children.add(c)
            self._local.child = c
        return c

    def _drop(self, c: _Child) -> None:
        c.kill()
        with self._lock:
            self._children.discard(c)
        self._local.child = None

    def _run(self, request: dict, timeout: float) -> dict:
        self._count("calls")
        c = self._child()
        try:
            reply = c.ask(request, time.monotonic() + timeout)
        except _Deadline:
            self._drop(c)
            self._count("timeouts")
            self._count("restarts")
            return {"score": 0.0, "timed_out": True}
        except GradingError:
            self._drop(c)
            self._count("crashes")
            raise
        if "error" in reply:
            raise GradingError(f"grading failed: {reply['error']}")
        if reply.get("timed_out"):
            self._count("timeouts")
        return reply

    def call(self, request: dict, timeout: float = DEFAULT_TIMEOUT) -> dict:
        """Run one request in a grading process, waiting at most `timeout` s once a process has taken it. Do not
        call it from a function that itself runs in this pool."""
        if self._closed:
            raise GradingError("the grading pool is closed")
        return self._executor.submit(self._run, request, float(timeout)).result()

    async def acall(self, request: dict, timeout: float = DEFAULT_TIMEOUT) -> dict:
        if self._closed:
            raise GradingError("the grading pool is closed")
        return await asyncio.wrap_future(self._executor.submit(self._run, request, float(timeout)))

    def verify(self, golds: list[str], answer: str, source: str, timeout: float = DEFAULT_TIMEOUT) -> dict:
        """Whether math-verify finds `answer` (from a \\boxed{}, a stated answer or a bare number: `source`)
        equivalent to any of `golds`: {"score": 1.0 | 0.0, "timed_out": bool}."""
        return self.call(_verify_request(golds, answer, source, timeout), timeout)

    async def averify(self, golds: list[str], answer: str, source: str, timeout: float = DEFAULT_TIMEOUT) -> dict:
        return await self.acall(_verify_request(golds, answer, source, timeout), timeout)

    def warm_up(self) -> None:
        """Start every process now (each imports sympy: about a second), not at the first item."""
        barrier = threading.Barrier(self.processes)

        def start(_):
            try:
                self._child()
            except BaseException:
                barrier.abort()
                raise
            try:
                barrier.wait(STARTUP_TIMEOUT)    # every thread takes one task, so every process starts
            except threading.BrokenBarrierError:
                pass

        list(self._executor.map(start, range(self.processes)))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            children = list(self._children)
            self._children.clear()
        for c in children:
            c.kill()
        self._executor.shutdown(wait=False, cancel_futures=True)


def _verify_request(golds, answer, source, timeout) -> dict:
    return {"op": "verify", "golds": [str(g) for g in golds], "answer": str(answer), "source": str(source),
            "timeout": float(timeout)}


_pool: GradingPool | None = None
_pool_lock = threading.Lock()


def grading_pool(processes: int | None = None) -> GradingPool:
    """This process's pool, made on first use with `processes` (default DEFAULT_PROCESSES) processes."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool._closed:
            _pool = GradingPool(processes or DEFAULT_PROCESSES)
        return _pool


def grading_stats() -> dict:
    """Counters of this process's pool: calls, timeouts (items that scored 0 for running out of time), restarts
    (processes killed at a deadline), crashes (processes that died)."""
    with _pool_lock:
        return dict(_pool.stats) if _pool is not None else {"calls": 0, "timeouts": 0, "restarts": 0, "crashes": 0}


@atexit.register
def close_grading_pool() -> None:
    """Stop this process's grading processes (a later call starts a new pool)."""
    with _pool_lock:
        pool = _pool
    if pool is not None:
        pool.close()


# ------------------------------------------------------------------------------------------------ the child side
def _gold_candidates(label: str, seconds: int, parse, TimeoutException) -> tuple[list, bool]:
    """math-verify's parse of a gold label: as LaTeX ($label$) first, then raw. A label that already carries
    $...$ or a \\boxed{} is parsed as it is."""
    s = label.strip()
    if not s:
        return [], False
    tries = [s] if ("$" in s or "\\boxed" in s or "\\fbox" in s) else [f"${s}$", s]
    for t in tries:
        try:
            got = parse(t, parsing_timeout=seconds, raise_on_error=True)
        except TimeoutException:
            return [], True
        except Exception:
            got = []
        if got:
            return got, False
    return [], False


def _strip_delims(s: str) -> str:
    from slime_actors.rewards.answers import strip_math_delimiters
    return strip_math_delimiters(s)


def _verify(req: dict) -> dict:
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException
    # math-verify's alarms take whole seconds; three of them (gold, answer, comparison) fit in the item's deadline
    seconds = max(1, int(float(req.get("timeout", DEFAULT_TIMEOUT)) // 3))
    answer, source = req["answer"], req["source"]
    timed_out = False
    tries = [f"\\boxed{{{answer}}}"] if source == "boxed" else [f"${_strip_delims(answer)}$", answer]
    pred = []
    for t in tries:
        try:
            pred = parse(t, parsing_timeout=seconds, raise_on_error=True)
        except TimeoutException:
            return {"score": 0.0, "timed_out": True}
        except Exception:
            pred = []
        if pred:
            break
    if not pred:
        return {"score": 0.0, "timed_out": False}
    for g in req["golds"]:
        gold, t_out = _gold_candidates(g, seconds, parse, TimeoutException)
        timed_out = timed_out or t_out
        if not gold:
            continue
        try:
            ok = verify(gold, pred, timeout_seconds=seconds, raise_on_error=True)
        except TimeoutException:
            timed_out, ok = True, False
        except Exception:
            ok = False
        if ok:
            return {"score": 1.0, "timed_out": False}
    return {"score": 0.0, "timed_out": timed_out}


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this process when the thread that started it ends (its pool closed, or the reward
    worker died) -- even in the middle of a computation in C that holds the GIL and ignores every alarm."""
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:    # the parent was already gone
        os._exit(0)


def _child_main() -> int:
    import logging
    _die_with_parent(GRADING_PARENT.get() or os.getppid())
    logging.disable(logging.CRITICAL)    # math-verify logs a warning for every timeout and parse failure
    out = os.fdopen(os.dup(1), "wb")     # frames go to the original stdout; a stray print goes to stderr
    os.dup2(2, 1)
    inp = sys.stdin.buffer

    def send(obj) -> None:
        data = msgpack.packb(obj, use_bin_type=True)
        out.write(_LEN.pack(len(data)) + data)
        out.flush()

    try:   # warm: the first item should not pay for the imports and math-verify's first-use set-up
        from math_verify import parse, verify
        verify(parse("$\\frac{1}{2}$", parsing_timeout=None), parse("\\boxed{0.5}", parsing_timeout=None),
               timeout_seconds=None)
    except Exception as exc:
        send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    send({"ready": True, "pid": os.getpid()})
    while True:
        head = inp.read(_LEN.size)
        if len(head) < _LEN.size:
            return 0                      # the parent closed the pipe (or died)
        body = inp.read(_LEN.unpack(head)[0])
        try:
            req = msgpack.unpackb(body, raw=False)
            if not isinstance(req, dict) or req.get("op") != "verify":
                raise ValueError(f"unknown request {req!r:.100}")
            reply = _verify(req)
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        send(reply)

