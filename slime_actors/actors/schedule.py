"""An actor's schedule: the order in which its tasks ran, kept with its trace so that replay runs them in that order.

An actor's code runs in *steps*: a task runs from one `await` that suspended it to the next. When several of its
tasks are ready at once -- a reply came back to one, an engine answered another, a third one's timer fired -- which
runs first depends on the timing of the run, and the order decides what each sees of the state they share (how many
generate calls have come back when the pull loop asks for more work). A deterministic-replay debugger records such
thread interleavings; this records the task interleaving:

* every task the actor's code creates is *tracked* (the event loop's task factory wraps its coroutine in a
  `Stepper`) and named by where it was created, the same way on any run: `start` (on_start), `stop` (Actor.stop,
  when the actor is stopped from outside its tasks: a signal, the process hosting it), `m:<message id>` (the
  handler of that request, and `m:<id>+1`, ... for other tasks created while it was dispatched), `<parent>.<k>`
  (the k-th task created by a tracked task: spawn, gather, wait_for ...);
* each step of a tracked task is one record in the trace ("step", or "resume" -- naming the call -- when the task
  resumed from an external call): the task's name and when the step began. Records are written in the order things happened, so the trace file holds the
  schedule, interleaved with the messages the actor received.

An *external call* is one whose inner workings are not the actor's and differ between a run and its replay: the
mailbox's sends and asks, `Actor.recorded_async` (an engine call), `Actor.run_blocking` (thread work). Steps taken
inside one (the mailbox waiting for a peer's endpoint, an HTTP client reading a socket) are not recorded, and tasks
created inside one are not tracked; the step in which the call returns is ("resume"). Mark a function as one with
`external`; replay's stand-ins for them are marked too.

Nor is a task that a *finalizer* creates: an object's `__del__` (or a `weakref.finalize` callback) runs wherever the
garbage collector or the last reference's owner happens to be -- in the middle of any step, at a point set by the
process's allocation history rather than by the actor's code -- and a client library may start work from there
(openai's and anthropic's HTTP clients, left unclosed, `create_task(self.aclose())` when collected). Tracked, such a
task would take a child name of the stepping task (`<parent>.<k>`) and shift the names of that task's later children,
so the recording and its replay -- whose collections fall elsewhere -- would name different tasks alike.

Under replay (slime_actors/traces/replay.py) the schedule is a `ReplaySchedule`: its steppers hold each step until
the recording says it is that task's turn.

The schedule is recorded whenever the actor is traced, through the trace writer's hot-path entry: a record of about
30 bytes and ~1 us per step (bench/trace_cost.py measures it).
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import sys
import time
import types
import weakref
from typing import Any, Callable

_CORO = types.CoroutineType
_time_ns = time.time_ns
REGIONS: dict = {}  # code object of an external call (see the module docstring) -> its name, as bytes

STEP, RESUME = "step", "resume"  # the trace's schedule records (docs/trace-format.md)
STOPPED = "stop"  # the task that stops the actor when it is stopped from outside its tasks (Actor.stop)
SCHEDULE_EVENTS = (STEP, RESUME)

_stepping: "Stepper | None" = None  # the tracked task whose step runs now (the event loop's thread)
_untracked = False                 # inside `untracked()`
DISPATCHERS: set = set()           # code objects of the functions that dispatch an actor's requests (dispatcher())


def external(fn, name: str | None = None):
    """Mark an async function (or method) as an external call: see the module docstring. `name` (default: the
    function's) is what a `resume` record says the task resumed from; a stand-in for a call takes its name."""
    REGIONS[fn.__code__] = (name or fn.__name__).encode()
    return fn


def dispatcher(fn):
    """Mark the function that dispatches an actor's requests (Actor._on_request, locals `self` and `h`, the
    request's header): a task created under it, outside any tracked task, is the request's (`m:<id>+k`)."""
    DISPATCHERS.add(fn.__code__)
    return fn


def region_of(coro) -> Any:
    """The external call a suspended coroutine chain is inside (its outermost one), or None."""
    c = coro
    while type(c) is _CORO:
        if c.cr_code in REGIONS:
            return c
        c = c.cr_await
    return None


class Stepper(collections.abc.Coroutine):
    """A tracked task's coroutine: runs it step by step and records each step in the schedule."""

    __slots__ = ("sched", "id", "idb", "coro", "region", "nchild", "__weakref__")

    def __init__(self, sched: "Schedule", tid: str, coro):
        self.sched, self.id, self.idb, self.coro = sched, tid, tid.encode(), coro
        self.region = None   # the external call the task is suspended in (None: in the actor's code)
        self.nchild = 0      # tasks it created so far (names its children)

    # send and throw are one step each, written out (not one shared helper): a Python call fewer on every step
    def send(self, value):
        global _stepping
        before = self.region
        prev, _stepping = _stepping, self
        t = _time_ns()
        try:
            out = self.coro.send(value)
        except BaseException:  # the task ended (returned, raised or was cancelled)
            _stepping = prev
            self._ended(t, before)
            raise
        _stepping = prev
        self._stepped(t, before)
        return out

    def throw(self, typ, val=None, tb=None):
        global _stepping
        before = self.region
        prev, _stepping = _stepping, self
        t = _time_ns()
        try:
            out = self.coro.throw(typ) if val is None and tb is None else self.coro.throw(typ, val, tb)
        except BaseException:
            _stepping = prev
            self._ended(t, before)
            raise
        _stepping = prev
        self._stepped(t, before)
        return out

    def _stepped(self, t: int, before) -> None:
        """The step that began at `t` (suspended in external call `before`, or None) suspended again: record it."""
        if before is None:
            self.region = region_of(self.coro)
            self.sched.rec(STEP, t, b"", self.idb)
        elif before.cr_frame is None:  # the external call it was suspended in returned in this step
            self.region = region_of(self.coro)
            self.sched.rec(RESUME, t, REGIONS[before.cr_code], self.idb)
        # else: still inside that call (its own waiting, not the actor's schedule): nothing to record

    def _ended(self, t: int, before) -> None:
        self.region = None
        if before is None:
            self.sched.rec(STEP, t, b"", self.idb)
        else:
            self.sched.rec(RESUME, t, REGIONS[before.cr_code], self.idb)

    def close(self):
        return self.coro.close()

    def __await__(self):
        return self.coro.__await__()

    def __getattr__(self, name: str):
        """The wrapped coroutine's attributes (cr_code, cr_frame, __qualname__ ...: what asyncio's task repr and
        debuggers read); an awaitable that is not a native coroutine answers None for cr_code / cr_frame / cr_await
        and False for cr_running."""
        if name == "coro":  # not set yet (a half-built copy): no recursion through self.coro
            raise AttributeError(name)
        try:
            return getattr(self.coro, name)
        except AttributeError:
            if name in _CR_ABSENT:
                return _CR_ABSENT[name]
            raise


_CR_ABSENT = {"cr_code": None, "cr_frame": None, "cr_await": None, "cr_running": False}


_STEP_CODES = frozenset((Stepper.send.__code__, Stepper.throw.__code__))
_FINALIZE = weakref.finalize.__call__.__code__  # (a finalizer's frame: see the module docstring)


class Schedule:
    """Records an actor's schedule into its trace: `rec` is the trace writer's hot-path entry
    (rec(event, time_ns, header, body))."""

    replaying = False

    def __init__(self, rec: Callable[..., None], loop: asyncio.AbstractEventLoop):
        self.rec = rec
        self.loop = loop
        self._last_mid: str | None = None
        self._last_n = 0

    def stepper(self, coro, tid: str) -> Stepper:
        return Stepper(self, tid, coro)

    def task(self, coro, tid: str, name: str | None = None) -> asyncio.Task:
        """A tracked task named `tid` (the actor's own roots: "start")."""
        return self.loop.create_task(Stepper(self, tid, coro), name=name)

    def dispatch_child(self, mid: str) -> str:
        """The name of a task created while request `mid` is dispatched: its handler first, then +1, +2 ..."""
        if self._last_mid == mid:
            self._last_n += 1
            return f"m:{mid}+{self._last_n}"
        self._last_mid, self._last_n = mid, 0
        return "m:" + mid


def _dispatched(frame) -> "tuple[Any, str] | None":
    """(schedule, request id) of the request an actor is dispatching further up the stack, if any (none when a
    finalizer runs on the way: see the module docstring)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__" or frame.f_code is _FINALIZE:
            return None
        if frame.f_code in DISPATCHERS:
            loc = frame.f_locals
            sched = getattr(loc.get("self"), "_schedule", None)
            h = loc.get("h")
            if sched is not None and isinstance(h, dict) and isinstance(h.get("id"), str):
                return sched, h["id"]
            return None
        frame = frame.f_back
    return None


def _not_the_actors(frame) -> bool:
    """Is the code creating a task inside an external call, or a finalizer (looking up the stack to the running
    step)? Then the task is not the actor's: not tracked (the module docstring says why)."""
    while frame is not None:
        code = frame.f_code
        if code in REGIONS or code.co_name == "__del__" or code is _FINALIZE:
            return True
        if code in _STEP_CODES:
            return False
        frame = frame.f_back
    return False


def _factory(loop, coro, context=None, _chain=None):
    st = _stepping
    sched = None
    if type(coro) is not _CORO or _untracked:
        pass
    elif st is not None:
        if st.sched.loop is loop and not _not_the_actors(sys._getframe(1)):
            sched, tid = st.sched, f"{st.id}.{st.nchild}"
            st.nchild += 1
    else:  # created while an actor dispatches a request (a sync handler's spawn, say)?
        found = _dispatched(sys._getframe(1))
        if found is not None and found[0].loop is loop:
            sched, tid = found[0], found[0].dispatch_child(found[1])
    if sched is not None:
        coro = sched.stepper(coro, tid)
    if _chain is not None:
        return _chain(loop, coro) if context is None else _chain(loop, coro, context=context)
    return asyncio.Task(coro, loop=loop, context=context)


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Track the tasks actors create on `loop` (idempotent; keeps a task factory already set, wrapping it)."""
    current = loop.get_task_factory()
    if getattr(current, "_slime_schedule", False):
        return
    factory: Callable[..., Any] = _factory  # (called as factory(loop, coro[, context=...]))
    if current is not None:
        def chained(loop, coro, context=None):
            return _factory(loop, coro, context, current)
        factory = chained
    setattr(factory, "_slime_schedule", True)  # (a mark on the function: installed)
    loop.set_task_factory(factory)


@contextlib.contextmanager
def untracked():
    """Tasks created inside are not the actor's (a mailbox's background send): not tracked."""
    global _untracked
    saved, _untracked = _untracked, True
    try:
        yield
    finally:
        _untracked = saved


def current() -> Stepper | None:
    """The tracked task whose step runs now, if any."""
    return _stepping
