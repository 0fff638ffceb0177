"""`slime-actors replay RUN --actor ROLE/INDEX`: run one actor again against its recording, and compare.

The actor is built from what its trace file's header recorded (`actor_class`, `config`: the job's flags) and started
as usual, except that

* its mailbox is `ReplayMailbox`: nothing goes over a network. The recorded inbound messages (tells and asks) are
  delivered in the recorded order at the recorded times; an ask the actor sends is answered with the reply the
  recording holds for the matching recorded ask (same receiver, method and cause; the same body if there are
  several); every message the actor sends is kept and compared with the recording afterwards;
* its trace writer is `ReplayTracer`: nondeterministic inputs the actor takes through `Actor.recorded()` /
  `recorded_async()` (engine answers, clock readings) come from the recording, at the time they were recorded;
* the event loop runs on a virtual clock that starts at the recording's start and jumps to the next recorded event
  or timer whenever the actor is idle, so a replay takes the time of its computation, not of the run (asyncio.sleep,
  wait_for and ask deadlines all follow it). Work in threads (`run_blocking`) runs for real, with the clock stopped;
* its schedule is `ReplaySchedule`: the actor's tasks take their steps in the order the recording's schedule holds
  (trace version 5: slime_actors/actors/schedule.py), and inbound messages arrive at their place among them. When a
  task's recorded turn cannot come (the replay diverged), that is reported ("schedule") and the rest runs freely;
  a recording without a schedule runs freely throughout, with a note;
* it cannot reach the network: socket connects raise (an actor that tries is reported), the trainer's weight
  broadcast is a no-op, the rollout worker starts no engine (its launch, exit codes and health are recorded);
* it is handed these stand-ins through `Actor.start(host=ReplayHost(...))` (slime_actors/actors/host.py), not by
  patching modules;
* what it writes goes to a temporary directory: the run directory and the job's output paths (--save,
  --save-debug-rollout-data, ...) are mapped there, and mapped back before bodies are compared.

The comparison: every outbound message (requests matched by receiver, method and cause, replies by the request they
answer) field by field, floats within --rtol/--atol, leaving out fields that measure the machine rather than the
computation (compare.volatile_for_replay); and every handler's outcome (ok / error / rejected). The report names
the first difference -- message, field, recorded value, replayed value -- or says "identical".

A recording that lacks something replay needs (a body over the trace's body limit, arrays recorded by checksum
only, an input recorded before it was recorded) stops the replay with a message saying what is missing and how to
record it (SLIME_ACTORS_TRACE_BODY_LIMIT, --trace-keep-arrays).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import shutil
import socket
import tempfile
import time
import types
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import msgpack

from ..actors import schedule as _schedule
from ..actors.host import Host
from ..actors.schedule import RESUME, STEP, Stepper, region_of
from ..config import FIELDS, ConfigError, JobConfig
from ..log import get_logger
from ..mailbox import codec
from ..mailbox.tracing import LATE
from ..recorder import environment as _env
from .compare import LOGIC, Difference, LeafDifference, leaf_differences, volatile_for_replay
from .reader import Event, TraceFile, TraceFormatError, TraceRun, decode_recorded_body, recorded_environment
from ..recorder.writer import digest

log = get_logger(actor="replay")

PLUMBING = frozenset(("register", "watch", "deregister", "lookup"))  # the mailbox's own asks to the directory
# asks for where a role serves (a retriever replica's URL): routing, like the directory's lookups. The retriever
# client asks them lazily, so often from inside a recorded call (an environment's step that searches); a replay serves
# that call's answer whole and does not make the asks inside it -- a recorded one the replay did not send is no
# difference
ADDRESS_ASKS = frozenset(("address",))


# flags that changed what a job does by default when they came: a recording made before one existed (its config lacks
# it) is replayed with the value that does what the job did then
BEFORE_FLAG = {"no_rolling_save": True}   # the rolling checkpoint of a job without --save (issue 27)


class ReplayError(Exception):
    """The actor cannot be replayed from this recording; the message says why and what would help."""


class ReplayGap(ReplayError):
    """The recording lacks something the replay needs at this point."""


class ReplayOver(ReplayError):
    """The replayed actor asked for more than the recording holds while replay stopped it (after its last event)."""


class ReplayNetworkError(ConnectionRefusedError):
    """A replayed actor tried to open a network connection."""


class RecordedError(RuntimeError):
    """An input that raised when it was recorded (an engine call that failed) raises again on replay."""


# ------------------------------------------------------------------------------------------------------- recording
@dataclass
class Recording:
    actor: str
    file: TraceFile
    t0: int
    end: int
    inbound: list[Event]                     # tells, asks and heartbeats the actor received, in order
    outbound: list[Event]                    # what it sent (requests and replies), in order
    replies: dict[str, Event]                # ask id -> the reply/error the actor received
    handled: dict[str, Event]                # request id -> its handled record
    inputs: list[Event]
    drops: int
    other_files: list[str] = field(default_factory=list)
    # the schedule (trace version 5): its tasks' steps and the inbound messages, in the order they happened
    items: list[Item] = field(default_factory=list)
    plumbing: dict[str, deque] = field(default_factory=dict)  # method -> the directory's replies to its asks
    registered: bool = False  # it registered with a directory (asked it anything)

    @property
    def meta(self) -> dict:
        return self.file.meta


def load_recording(run: TraceRun, actor: str, pid: int | None = None) -> Recording:
    # a process's first file (segment 0): the actor's start, which replay needs; later segments are not replayed
    files = [f for f in run.files if f.meta.get("actor") == actor and f.segment == 0]
    if not files:
        raise ReplayError(f"no trace file for {actor!r} in {run.root} (actors: {', '.join(run.actors())})")
    files.sort(key=lambda f: f.meta.get("started_ns", 0))
    if pid is not None:
        chosen = [f for f in files if f.meta.get("pid") == pid]
        if not chosen:
            raise ReplayError(f"{actor} has no trace file of pid {pid} (pids: {[f.meta.get('pid') for f in files]})")
        tf = chosen[0]
    else:
        tf = files[0]
    others = [str(f.path) for f in files if f is not tf]
    events = tf.events  # in the order they were written: the order they happened
    plumbing_asks = {e.id: e for e in events if e.ev == "send" and e.kind == "ask" and e.method in PLUMBING
                     and e.header.get("to") == "directory/0"}
    plumbing: dict[str, deque] = {}
    inbound, outbound, inputs = [], [], []
    replies, handled = {}, {}
    drops = 0
    for e in events:
        h = e.header or {}
        k = h.get("kind")
        if e.ev == "recv" and k in ("tell", "ask", "hb"):
            inbound.append(e)
        elif e.ev == "recv" and k in ("reply", "error"):
            if e.extra and e.extra.get(LATE):
                continue   # came after its ask had timed out: the replay times the ask out too
            ask = plumbing_asks.get(h.get("re"))
            if ask is None:
                replies.setdefault(h.get("re", ""), e)
            else:
                plumbing.setdefault(ask.method, deque()).append(e)
        elif e.ev == "send" and k in ("tell", "ask", "reply", "error"):
            if e.id in plumbing_asks:
                continue
            outbound.append(e)
        elif e.ev == "handled":
            handled[h.get("id", "")] = e
        elif e.ev == "input":
            inputs.append(e)
        elif e.ev == "drop":
            drops += 1
    t0 = tf.meta.get("started_ns") if isinstance(tf.meta.get("started_ns"), int) else (
        events[0].t_ns if events else 0)
    end = max((e.t_ns for e in events), default=t0)
    items: list[Item] = []
    if tf.schedule:
        merged = [(e.offset, 0, e) for e in inbound] + [(st.offset, 1, st) for st in tf.schedule]
        merged.sort(key=lambda x: (x[0], x[1]))
        for _, is_step, x in merged:
            if is_step:
                items.append(Item(RESUME if x.resume else STEP, x.t_ns, x.task, None, x.resume, x.offset))
            else:
                items.append(Item(INBOUND, x.t_ns, None, x, None, x.offset))
        end = max(end, tf.schedule[-1].t_ns)
    return Recording(actor, tf, t0, end, inbound, outbound, replies, handled, inputs, drops, others, items,
                     plumbing, bool(plumbing_asks))


INBOUND = "inbound"


class Item(NamedTuple):
    """One entry of the recorded schedule: a step of task `task` (STEP, or RESUME from an external call), or the
    delivery of an inbound message `event`."""

    kind: str
    t_ns: int
    task: str | None
    event: Event | None
    call: str | None = None  # RESUME: the external call it resumed from ("ask", "recorded_async", ...)
    offset: int = 0          # where it is in the trace file


# ------------------------------------------------------------------------------------------------------- clock
class VirtualClock:
    """Runs a (stock asyncio) event loop on virtual time: when nothing is ready, time jumps to the next timer
    instead of waiting for it. While work runs in executor threads the clock stands still and the loop waits for
    real (that work's completion wakes it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, start: float = 0.0, real_timeout: float = 600.0):
        self.loop, self.now, self.jobs, self.expired = loop, start, 0, False
        self.schedule: ReplaySchedule | None = None  # told before the clock moves on while it waits for a task
        self.real_deadline = time.monotonic() + real_timeout
        self.real_timeout = real_timeout
        self._select = loop._selector.select
        loop._selector.select = self._virtual_select
        loop.time = lambda: self.now
        orig = loop.run_in_executor

        def run_in_executor(executor, fn, *args):
            fut = orig(executor, fn, *args)
            self.jobs += 1
            fut.add_done_callback(self._job_done)
            return fut
        loop.run_in_executor = run_in_executor

    def _job_done(self, _fut) -> None:
        self.jobs -= 1
        if not self.jobs and self.schedule is not None:
            self.schedule._pump_soon()  # the schedule held still while the thread worked (ReplaySchedule._pump)

    def _virtual_select(self, timeout):
        if self.expired:  # said so once; the loop is being wound down
            return self._select(0)
        if time.monotonic() > self.real_deadline:
            self.expired = True
            raise ReplayError(f"replay took longer than {self.real_timeout:g} s of real time (--timeout)")
        if timeout is not None and timeout <= 0:
            return self._select(0)
        if self.jobs:  # a thread is working: wait for it for real (its completion wakes the loop)
            return self._select(0.05)
        if self.schedule is not None and self.schedule.idle(self.now, timeout):
            return self._select(0)  # it gave up following the recorded schedule: things became ready
        if timeout is None:
            return self._select(0.01)  # nothing scheduled and nothing running: the replay driver ends it
        self.now += timeout
        return self._select(0)

    def advance(self, vt: float) -> None:
        """Move the clock forward to `vt` (never back)."""
        if vt > self.now:
            self.now = vt


# ------------------------------------------------------------------------------------------------------- schedule
FREE, NOW, TURN = "free", "now", "turn"  # what ReplaySchedule.turn() found
STALL_SLACK = 0.5  # s of virtual time past a task's recorded step before replay decides it will not come


class GatedStepper(Stepper):
    """A tracked task of the replayed actor: each of its steps waits until the recorded schedule says it is its
    turn (steps that begin inside an external call are ordered by the call's stand-in instead: ReplaySchedule.turn)."""

    __slots__ = ("pending", "gate", "at")

    def __init__(self, sched: "ReplaySchedule", tid: str, coro):
        super().__init__(sched, tid, coro)
        self.pending = None
        self.gate = None
        self.at = 0  # file offset of the recorded step it runs now (ReplaySchedule.turn)

    def send(self, value):
        return self._gated(False, (value,))

    def throw(self, typ, val=None, tb=None):
        return self._gated(True, (typ,) if val is None and tb is None else (typ, val, tb))

    def _gated(self, is_throw: bool, args: tuple):
        s = self.sched
        if self.gate is not None:  # woken while waiting for its turn: its turn came, or it was cancelled
            self.gate = None
            if not is_throw:
                is_throw, args = self.pending
            self.pending = None
        if self.region is None and not s.free and not s.take(self, STEP):
            self.pending = (is_throw, args)
            self.gate = s.gate(self)
            self.gate._asyncio_future_blocking = True  # yielded to the task as an awaited future is
            return self.gate
        prev, _schedule._stepping = _schedule._stepping, self
        try:
            out = self.coro.throw(*args) if is_throw else self.coro.send(*args)
        except BaseException:
            self.region = None
            s.ended(self)
            raise
        finally:
            _schedule._stepping = prev
        self.region = region_of(self.coro)
        return out


class ReplaySchedule:
    """Runs the replayed actor's tracked tasks in the recorded order, and delivers its inbound messages where they
    came in that order. Gives up (a "schedule" difference, then runs freely as a recording without a schedule would)
    when the next recorded step cannot come: its task is not waiting for anything the replay can still deliver."""

    replaying = True

    def __init__(self, harness: "Harness", items: list[Item]):
        self.h = harness
        self.items = items
        self.head = 0
        self.loop = harness.loop
        self.free = False
        self.diverged: str | None = None
        self.gated: dict[str, asyncio.Future] = {}
        self.tasks: dict[str, GatedStepper] = {}
        self.next_of: dict[str, collections.deque] = {}
        for i, it in enumerate(items):
            if it.task is not None:
                self.next_of.setdefault(it.task, collections.deque()).append(i)
        self.done = self.loop.create_future()  # set when it is over: the recording ended, or it gave up
        self._pumping = False
        self._stopping = False
        self.ended_tasks: set[str] = set()  # tasks of the replay that ended
        self.skipped = 0  # recorded steps of tasks that had already ended in the replay (changed code)
        self._last_mid: str | None = None
        self._last_n = 0

    # the Schedule interface (schedule.py)
    def stepper(self, coro, tid: str) -> GatedStepper:
        st = GatedStepper(self, tid, coro)
        self.tasks[tid] = st
        return st

    def task(self, coro, tid: str, name: str | None = None) -> asyncio.Task:
        return self.loop.create_task(self.stepper(coro, tid), name=name)

    dispatch_child = _schedule.Schedule.dispatch_child

    def ended(self, st: GatedStepper) -> None:
        self.tasks.pop(st.id, None)
        self.ended_tasks.add(st.id)

    # following the recording
    def start(self) -> None:
        self._pump_soon()

    def take(self, st: Stepper, kind: str, call: str | None = None) -> bool:
        """Is `st`'s next step (of `kind`; resuming from `call`) the next thing in the recording? Then it takes it."""
        if self.head >= len(self.items):
            self._over()
            return True
        it = self.items[self.head]
        if it.task != st.id or it.kind != kind:
            return False
        if call is not None and it.call != call:
            self.give_up(it, f"recorded: task {st.id} resumed from {it.call}; in the replay it returns from {call}")
            return True
        self.head += 1
        q = self.next_of.get(st.id)
        if q:
            q.popleft()
        st.at = it.offset
        self.h.clock.advance(self.h.vt(it.t_ns))
        self._pump_soon()
        return True

    def gate(self, st: Stepper) -> asyncio.Future:
        """A future set when it is `st`'s turn (or the schedule is given up)."""
        fut = self.loop.create_future()
        old = self.gated.get(st.id)
        if old is not None and not old.done():
            old.cancel()
        self.gated[st.id] = fut
        self._pump_soon()
        return fut

    async def turn(self, call: str, recorded: Event | None = None) -> str:
        """Called by the stand-in of external call `call` ("ask", ...) as it ends: waits for the recorded resumption
        of the task that made the call. `recorded`: the call's record in the recording (what it sent, the input it
        took), which tells whether the call suspended there: its record then comes after the record of the step
        that made it (records of a step are written before the step's own, at its end). NOW: it did not suspend;
        TURN: it did, and now is its turn; FREE: there is no schedule to follow (or the recording ended with the
        task still in the call: then once the recording is over)."""
        st = _schedule.current()
        if st is None or st.sched is not self or self.free:
            return FREE
        if recorded is not None and recorded.offset < st.at:
            return NOW  # recorded within the step that made the call: it returned without suspending
        q = self.next_of.get(st.id)
        nxt = self.items[q[0]] if q else None
        if nxt is not None and (nxt.kind == STEP or (recorded is None and nxt.call != call)):
            return NOW
        if nxt is None:
            if self.h.rec_complete:  # the recording has no further step of this task, though it runs to the end
                self.give_up(None, f"task {st.id} returned from {call} in {_caller()}, a step the recording does "
                                   "not have (the actor's code differs from the recorded run's)")
                return FREE
            await asyncio.shield(self.done)  # the recording was cut (a kill) with this task still waiting here
            return FREE
        cancelled = None
        while not self.take(st, RESUME, call):
            if self.free:
                break
            try:
                await self.gate(st)
            except asyncio.CancelledError as exc:  # cancelled while waiting: that too happens in its turn
                cancelled = exc
        if cancelled is not None:
            raise cancelled
        return TURN if not self.free else FREE

    def _pump_soon(self) -> None:
        if not self._pumping and not self.free:
            self._pumping = True
            self.loop.call_soon(self._pump)

    def _pump(self) -> None:
        """Deliver the inbound messages at the head of the schedule; open the gate of the task whose turn it is."""
        self._pumping = False
        while not self.free:
            if self.h.clock.jobs:
                # a thread is working: the clock stands still, and so does the schedule (what comes next in the
                # recording came after that work in the run's time; its completion pumps again -- else the
                # thread's real time would decide whether its task's step came before the recording's next one)
                return
            if self.head >= len(self.items):
                self._over()
                return
            it = self.items[self.head]
            if it.task == _schedule.STOPPED and it.task not in self.tasks and not self._stopping:
                # stopped from outside its tasks here: so is the replayed actor (its task "stop" takes the step)
                self._stopping = True
                self.h.clock.advance(self.h.vt(it.t_ns))
                self.h.stop_as_recorded()
                return
            if it.kind != INBOUND and it.task in self.ended_tasks and it.task not in self.tasks:
                # a step the recording has of a task that ended sooner in the replay (its code changed): the task
                # will not run again; go on with the others' steps
                self.head += 1
                q = self.next_of.get(it.task)
                if q:
                    q.popleft()
                self.skipped += 1
                continue
            if it.kind != INBOUND:
                fut = self.gated.pop(it.task, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
                return
            self.head += 1
            self.h.clock.advance(self.h.vt(it.t_ns))
            try:
                self.h.deliver(it.event)
            except (ReplayGap, ReplayOver):  # (over: a cut recording's last message, whose inputs were lost)
                self._over()
                return

    def idle(self, now: float, timeout: float | None) -> bool:
        """The loop has nothing ready: the clock would move to now + timeout (None: nothing is scheduled). When the
        task whose turn it is cannot be woken by then, the replay has left the recorded schedule: give up."""
        if self.free or self.head >= len(self.items):
            return False
        it = self.items[self.head]
        if it.kind == INBOUND or (it.task in self.ended_tasks and it.task not in self.tasks):
            self._pump_soon()
            return True
        if timeout is not None and now + timeout <= self.h.vt(it.t_ns) + STALL_SLACK:
            return False
        st = self.tasks.get(it.task)
        if st is None:
            where = "there is no such task (never created, or it ended)"
        elif it.task in self.gated:
            where = "it is waiting for its turn"  # (not reached: a gated task at the head is released)
        else:
            where = f"it is still waiting at {_where(st.coro)}"
        self.give_up(it, f"recorded: task {it.task} {'resumed from an external call' if it.kind == RESUME else 'ran'}"
                         f" here; in the replay {where}")
        return True

    def give_up(self, it: Item | None, why: str) -> None:
        if self.free:
            return
        self.diverged = why
        self.h.schedule_diverged(it, why)
        self._over()

    def _over(self) -> None:
        if self.free:
            return
        self.free = True
        if self.diverged is None:  # all of it replayed: what the actor does from here on was never recorded
            self.h.recording_over()
        for fut in self.gated.values():
            if not fut.done():
                fut.set_result(None)
        self.gated.clear()
        if not self.done.done():
            self.done.set_result(None)


def _caller() -> str:
    """Where the actor's code made the external call whose stand-in runs now: the first frame up the stack that is
    neither a stand-in nor an external call (function, file and line)."""
    import sys
    f = sys._getframe(1)
    while f is not None and (f.f_code in _schedule.REGIONS or f.f_code.co_filename == __file__):
        f = f.f_back
    if f is None:
        return "(unknown)"
    return f"{f.f_code.co_name} ({os.path.basename(f.f_code.co_filename)}:{f.f_lineno})"


def _where(coro) -> str:
    """Where a suspended coroutine chain waits: the innermost frame's function, file and line."""
    frame, c = None, coro
    while type(c) is types.CoroutineType:
        if c.cr_frame is not None:
            frame = c.cr_frame
        c = c.cr_await
    if frame is None:
        return "(not started)"
    return f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})"


# ------------------------------------------------------------------------------------------------------- outputs
@dataclass
class Out:
    kind: str
    to: str
    method: str
    body: Any            # decoded the way the recording decodes bodies (arrays by dtype/shape/checksum)
    checksum: str        # of the encoded body, as the writer computes it for bodies over the limit
    parent: str | None
    re: str | None
    vt: float
    id: str
    matched: Event | None = None
    after_end: bool = False  # sent once every recorded event had been replayed (what lies past the recording)
    at_cut: bool = False     # sent by a task the recording holds no further step of, in a recording cut short


class ReplayTracer:
    """Stands in for the TraceWriter: serves recorded inputs, and notes how each handler ended."""

    replaying = True

    def __init__(self, harness: "Harness"):
        self.h = harness
        self.records = 0
        self.lost = 0

    def record(self, ev, header, body=None, refs=None, buffers=None, extra=None) -> None:
        if ev == "handled" and header is not None:
            try:
                hid = codec.header_as_dict(msgpack.unpackb(bytes(header), raw=False)).get("id")
            except Exception:
                return
            rec = dict(extra or {})
            if self.h.final_stop_vt is not None:
                rec["_at_final_stop"] = True  # ended by the replay's own stop, after the recording's last event
            self.h.replay_handled[hid] = rec

    def record_input(self, name, value, key=None) -> None:
        pass  # the replayed actor takes its inputs from the recording (replay_input)

    def replay_input(self, name: str, key: str | None):
        value, _t = self.h.take_input(name, key)
        return _raise_or(value)

    async def replay_input_async(self, name: str, key: str | None):
        if not self.h.has_input(name, key):
            # the recording's call never answered: it ended with the task still waiting in it (a killed process:
            # never returns), or the task was cancelled in it (its turn raises CancelledError), or it is missing
            await self.h.unless_last()
            await self.h.turn("recorded_async")
        value, ev = self.h.take_input_event(name, key)
        if await self.h.turn("recorded_async", ev) == FREE:
            await self.h.sleep_until(ev.t_ns)
        return _raise_or(value)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _raise_or(value):
    """A recorded input, or the exception its call raised (slime_actors.actors.base.raised): of the recorded class
    when it can be imported (so the actor's `except EngineError` catches it as it did), else a RecordedError named
    after it."""
    if not (isinstance(value, dict) and "__raised__" in value and "message" in value
            and set(value) <= {"__raised__", "message", "attrs"}):
        return value
    name, message = str(value["__raised__"]), str(value["message"])
    cls = _exception_class(name)
    if cls is None:
        raise type(name.rpartition(":")[2].rpartition(".")[2], (RecordedError,), {})(message)
    exc = cls.__new__(cls)
    BaseException.__init__(exc, message)
    attrs = value.get("attrs")
    if isinstance(attrs, dict):
        try:
            exc.__dict__.update(attrs)
        except AttributeError:
            pass
    raise exc


def _exception_class(name: str):
    import builtins
    import importlib
    mod, _, qual = name.rpartition(":")
    try:
        obj = importlib.import_module(mod) if mod else builtins
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError):
        return None
    return obj if isinstance(obj, type) and issubclass(obj, Exception) else None


class ReplayMailbox:
    """Stands in for the Mailbox: recorded replies answer the actor's asks; what it sends is kept for comparison."""

    def __init__(self, name: str, *, harness: "Harness", tracer=None, config=None, on_request=None, on_drop=None,
                 **_ignored):
        from ..mailbox.mailbox import MailboxConfig
        self.name, self.h = name, harness
        self.config = config or MailboxConfig()
        self.keys = None
        self.tracer = tracer
        self.on_request = on_request or (lambda inbound: None)
        self.on_drop = on_drop or (lambda reason, identity: None)
        self.endpoint = None
        self.stats = {"sent": 0, "received": 0, "replies": 0, "dropped": 0, "late_replies": 0}
        self._n = 0

    async def bind(self, endpoint: str) -> str:
        self.endpoint = f"replay://{self.name}"
        return self.endpoint

    def connect(self, name, endpoint):
        return None

    def disconnect(self, name, reason=""):
        return None

    def peers(self) -> dict:
        return {}

    def pause_receiving(self, paused: bool) -> None:
        pass

    def close(self) -> None:
        pass

    def _new_id(self) -> str:
        self._n += 1
        return f"replay{self._n:010x}"

    async def heartbeat(self, to, body) -> None:
        await self.h.turn("heartbeat")

    async def tell(self, to: str, method: str, body: Any = None, *, host_copy: bool = False) -> str:
        out = self.h.sent("tell", to, method, body, None)
        self.stats["sent"] += 1
        await self.h.turn("tell", out.matched)
        return out.id

    async def ask(self, to: str, method: str, body: Any = None, *, timeout: float | None = None,
                  idem: str | None = None, host_copy: bool = False) -> Any:
        from ..mailbox.errors import AskTimeout, RemoteError
        timeout = self.config.default_timeout if timeout is None else timeout
        if to == "directory/0" and method in PLUMBING:  # the actor's own register/watch/deregister
            return await self._plumbing(method, timeout)
        out = self.h.sent("ask", to, method, body, None)
        self.stats["sent"] += 1
        rec = out.matched
        reply = self.h.rec.replies.get(rec.id) if rec is not None else None
        free = await self.h.turn("ask", reply) == FREE  # (the reply's record: after the step that asked)
        if reply is None:
            # not in the recording, or the recorded ask was never answered: a peer that does not answer
            if free:
                await asyncio.sleep(timeout)
            raise AskTimeout(to, method, timeout)
        if free:
            await self.h.sleep_until(reply.t_ns)
        value = self.h.reply_value(reply, rec)
        self.stats["replies"] += 1
        if reply.kind == "error":
            e = value if isinstance(value, dict) else {"message": str(value)}
            raise RemoteError(str(e.get("peer", to)), str(e.get("method", method)), str(e.get("type", "Error")),
                              str(e.get("message", "")), e.get("traceback"))
        return value

    async def _plumbing(self, method: str, timeout: float) -> Any:
        """The directory's recorded answer to the actor's own register/watch/deregister (not compared)."""
        from ..mailbox.errors import AskTimeout, RemoteError
        q = self.h.rec.plumbing.get(method)
        reply = q.popleft() if q else None
        if await self.h.turn("ask", reply) == FREE:
            if reply is None:
                await asyncio.sleep(timeout)
            else:
                await self.h.sleep_until(reply.t_ns)
        if reply is None:
            raise AskTimeout("directory/0", method, timeout)
        value = self.h._decode(reply, f"the directory's reply to {method}", codec)
        if reply.kind == "error":
            e = value if isinstance(value, dict) else {"message": str(value)}
            raise RemoteError("directory/0", method, str(e.get("type", "Error")), str(e.get("message", "")), None)
        return value

    def reply_nowait(self, inbound, body: Any = None, *, error: dict | None = None, host_copy: bool = False):
        self._reply(inbound, body, error)
        return None

    def _reply(self, inbound, body: Any, error: dict | None) -> "Out":
        h = inbound.header
        out = self.h.sent("reply" if error is None else "error", h.get("from", "?"), h.get("method", ""),
                          body if error is None else error, h.get("id"))
        self.stats["sent"] += 1
        return out

    async def reply(self, inbound, body: Any = None, *, error: dict | None = None, host_copy: bool = False) -> None:
        out = self._reply(inbound, body, error)
        await self.h.turn("reply", out.matched)

    def reply_error_raw(self, identity, message) -> None:
        pass


for _fn in (ReplayMailbox.ask, ReplayMailbox.tell, ReplayMailbox.reply, ReplayMailbox.heartbeat):
    _schedule.external(_fn)


class ReplayClock:
    """The replayed actor's wall clock: the recording's time, on the virtual clock."""

    def __init__(self, harness: "Harness"):
        self.h = harness

    def time(self) -> float:
        return self.h.rec.t0 / 1e9 + self.h.loop.time()

    def time_ns(self) -> int:
        return self.h.rec.t0 + int(self.h.loop.time() * 1e9)


class ReplayHost(Host):
    """What the replayed actor gets instead of a process's: stand-ins (slime_actors/actors/host.py)."""

    def __init__(self, harness: "Harness"):
        self.h = harness
        self.clock = ReplayClock(harness)
        self.weight_sender = _NoWeightSender

    def mailbox(self, name: str, **kw) -> "ReplayMailbox":
        return ReplayMailbox(name, harness=self.h, **kw)

    def tracer(self, path, actor, *, meta, body_limit, keep_arrays, max_bytes=0) -> "ReplayTracer":
        return ReplayTracer(self.h)

    def schedule(self, actor):
        return self.h.sched

    async def in_thread(self, fn):
        """Thread work runs for real (the clock stands still meanwhile), then waits for its recorded resumption."""
        try:
            value = await asyncio.get_running_loop().run_in_executor(None, fn)
        except BaseException:
            await self.h.turn("run_blocking")
            raise
        await self.h.turn("run_blocking")
        return value


class _NoWeightSender:
    """The trainer's weight broadcast under replay: the engines are not there (their answers are recorded)."""

    def __init__(self, *args, **kwargs):
        pass

    def connect(self) -> None:
        pass

    def broadcast_bucket(self, bucket, flattened: bool = False) -> dict:
        return {}

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------------------- harness
@dataclass
class Finding:
    t_ns: int
    what: str                  # "differs", "missing", "extra", "outcome"
    message: str               # which message
    diff: Difference | None = None
    rec_id: str | None = None    # the recorded message that differs
    answers: str | None = None   # for a reply: the id of the request it answers
    kind: str = "logic"          # "float": only float values of the message differ (beyond --rtol/--atol)

    def render(self, t0: int) -> str:
        when = f"+{(self.t_ns - t0) / 1e9:.6f}s"
        line = f"{when}  {self.message}" + ("  [floats only]" if self.kind == "float" else "")
        if self.diff is not None:
            line += f"\n    {self.diff.path or 'body'}: recorded {_short(self.diff.a)}, replayed {_short(self.diff.b)}"
        return line


def _short(v) -> str:
    from .query import render_value
    return render_value(v, 200)


@dataclass
class FloatSummary:
    """The float-level differences of a replay: values that differ while everything else (structure, ints, strings,
    outcomes, the schedule) is the same -- what another CPU, another BLAS or another thread count makes of the same
    computation."""

    values: int = 0                       # float values (and float arrays) that differ
    messages: int = 0                     # messages holding them
    beyond: int = 0                       # values outside --rtol/--atol
    max_rel: float = 0.0                  # the largest |a-b| / max(|a|,|b|)
    max_at: tuple | None = None           # (message, field, recorded, replayed) where it is
    first_beyond: tuple | None = None     # (message, field, recorded, replayed): the first outside the tolerance
    arrays_by_checksum: int = 0           # float arrays recorded by checksum only: they differ, by how much unknown

    def add(self, message: str, diffs: list[LeafDifference], rtol: float, atol: float) -> None:
        self.messages += 1
        for d in diffs:
            self.values += 1
            if d.rel is None:
                self.arrays_by_checksum += 1
            elif d.rel > self.max_rel or self.max_at is None:
                self.max_rel, self.max_at = d.rel, (message, d.path, d.a, d.b)
            if not d.within(rtol, atol):
                self.beyond += 1
                if self.first_beyond is None:
                    self.first_beyond = (message, d.path, d.a, d.b)


@dataclass
class Report:
    actor: str
    file: str
    actor_class: str
    identical: bool                       # bit for bit: every compared value, every outcome, the schedule
    findings: list[Finding]               # logic differences (what is not a float-level difference), in time order
    stopped: str | None                   # why the replay could not go on (a gap), if it could not
    counts: dict
    notes: list[str]
    t0: int
    steps: list[dict] = field(default_factory=list)   # trainer: recorded vs replayed metrics per train reply
    floats: FloatSummary = field(default_factory=FloatSummary)
    rtol: float = 0.0
    atol: float = 0.0
    # (key, recorded, here) where the recording's environment (recorder/environment.py) differs from this
    # machine's; None: the recording holds none (made before it was recorded)
    environment: list | None = None
    cut: dict | None = None               # a recording cut short (its process killed): where, what it lost

    @property
    def logic(self) -> list[Finding]:
        """The differences that are not float values: a message, a field of another type, an outcome, the
        schedule."""
        return [f for f in self.findings if f.kind != "float"]

    @property
    def verdict(self) -> str:
        """identical (bit for bit) | floats (nothing but float values differ: another CPU, BLAS, thread count -- or a
        changed computation; magnitudes in `floats`) | different (a logic difference) | stopped (a gap)."""
        if self.stopped:
            return "stopped"
        if self.logic:
            return "different"
        return "floats" if self.floats.values else "identical"

    @property
    def within_tolerance(self) -> bool:
        """No logic difference, and every float within --rtol/--atol (true of an identical replay too)."""
        return self.verdict in ("identical", "floats") and not self.findings and not self.floats.arrays_by_checksum

    def render(self, show: int = 5) -> str:
        c = self.counts
        lines = [f"replay {self.actor} ({self.actor_class}) from {self.file}",
                 f"fed {c['inbound']} inbound message(s), served {c['replies']} recorded repl(y/ies) and "
                 f"{c['inputs']} recorded input(s); compared {c['compared']} outbound message(s) and "
                 f"{c['outcomes']} handler outcome(s)"]
        for n in self.notes:
            lines.append(f"note: {n}")
        if self.steps:
            lines.append("train steps (recorded -> replayed):")
            for s in self.steps:
                parts = [f"rollout {s['rollout_id']}"]
                for k in ("loss", "entropy", "grad_norm"):
                    if k in s["recorded"]:
                        parts.append(f"{k} {s['recorded'][k]:.6g} -> "
                                     + (f"{s['replayed'][k]:.6g}" if k in s["replayed"] else "?"))
                lines.append("  " + ", ".join(parts))
        if self.stopped:
            lines.append(f"replay stopped: {self.stopped}")
        if self.findings:
            f0 = self.findings[0]
            lines.append("first difference" + (" (nothing but floats differs)" if not self.logic else "") + ":")
            lines.append("  " + f0.render(self.t0).replace("\n", "\n  "))
            for f in self.findings[1:show]:
                lines.append("then:")
                lines.append("  " + f.render(self.t0).replace("\n", "\n  "))
            lines.append(f"{len(self.findings)} difference(s) in all")
        if self.floats.values:
            lines += self._render_floats()
        elif not self.stopped and not self.findings:
            lines.append(f"identical: {c['compared']} outbound message(s) and {c['outcomes']} outcome(s) match the "
                         "recording bit for bit")
        return "\n".join(lines)

    def _render_floats(self) -> list[str]:
        fl, c = self.floats, self.counts
        head = ("floats only: every message, field and outcome matches the recording except" if not self.logic
                else "also:")
        out = [f"{head} {fl.values} float value(s) in {fl.messages} message(s) (not bit-identical)"]
        if fl.max_at is not None:
            msg, path, a, b = fl.max_at
            out.append(f"  largest relative difference {fl.max_rel:.3g}: {msg}\n      {path}: recorded {_short(a)}, "
                       f"replayed {_short(b)}")
        if fl.arrays_by_checksum:
            out.append(f"  {fl.arrays_by_checksum} float array(s) differ by checksum (recorded without their bytes: "
                       "--trace-keep-arrays measures them)")
        tol = f"--rtol {self.rtol:g} --atol {self.atol:g}"
        if fl.beyond:
            msg, path, a, b = fl.first_beyond
            out.append(f"  {fl.beyond} of them beyond {tol}; the first: {msg}\n      {path}: recorded {_short(a)}, "
                       f"replayed {_short(b)}")
        elif not fl.arrays_by_checksum:
            out.append(f"  all within {tol}")
        if self.environment is None:
            out.append("  environment: the recording holds none (made before slime-actors recorded it), so which of "
                       "the machine, its libraries or its threads made the floats differ cannot be told")
        elif self.environment:
            out.append(f"  environment: the recording's differs from this machine's: {_env.describe(self.environment)}"
                       " (docs/reproducibility.md: what decides the bits)")
        else:
            out.append("  environment: the recording's is this machine's (libraries, CPU, threads): the floats differ "
                       "because the computation does (a --set, changed code), or by what the environment does not "
                       "fix (docs/reproducibility.md)")
        return out


class Harness:
    def __init__(self, run: TraceRun, actor: str, *, pid: int | None = None, overrides: dict | None = None,
                 path_map: list[tuple[str, str]] | None = None, rtol: float | None = None,
                 atol: float | None = None, timeout: float = 600.0, allow_network: bool = False,
                 workdir: str | None = None):
        self.run_ = run
        self.rec = load_recording(run, actor, pid)
        self.role = self.rec.meta.get("role") or actor.split("/", 1)[0]
        # the recording's checksums are checked with its own algorithm (files before "digest" hold CRC-32s)
        self.digest_algo = self.rec.meta.get("digest", "crc32")
        from ..recorder.writer import DIGESTS
        if self.digest_algo not in DIGESTS:
            raise ReplayError(f"{actor}: the recording's checksums are {self.digest_algo!r}, which this version "
                              f"does not know (known: {', '.join(DIGESTS)})")
        self.index = self.rec.meta.get("index", int(actor.split("/", 1)[1]) if "/" in actor else 0)
        loose = self.role == "trainer"
        self.rtol = rtol if rtol is not None else (1e-4 if loose else 0.0)
        self.atol = atol if atol is not None else (1e-6 if loose else 0.0)
        self.volatile = volatile_for_replay(self.role)
        self.timeout = timeout
        self.allow_network = allow_network
        self.overrides = dict(overrides or {})
        self.user_map = list(path_map or [])
        self._tmp = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="slime-replay-"))
        self.notes: list[str] = []
        if self.rec.other_files:
            which = (f"replaying pid {pid}'s" if pid is not None else "replaying the first (--pid picks another)")
            self.notes.append(f"{actor} has {len(self.rec.other_files)} more trace file(s) (restarts): "
                              f"{', '.join(self.rec.other_files)}; {which}")
        # the recording runs to the actor's end (its writer closed it); else it was cut: its process killed, or the
        # file rotated into a next segment -- and the replay stops where it ends (what lies past it is not compared)
        tf = self.rec.file
        stopped = any(it.task == _schedule.STOPPED or (it.event is not None and it.event.method == "_stop")
                      for it in self.rec.items)
        complete = tf.complete
        self.rec_complete = stopped if complete is None else complete   # (before version 6: its stop recorded)
        self.rec_cut = not self.rec_complete
        self.cut: dict | None = None
        if tf.rotated:
            later = [f for f in run.files if f.meta.get("actor") == actor and f.meta.get("pid") == tf.meta.get("pid")
                     and f.segment > 0]
            self.cut = {"why": "rotated", "t_ns": tf.end.get("t_ns"), "later_segments": len(later)}
            self.notes.append(f"the recording continues in {len(later)} later segment(s) kept after a rotation "
                              "(--trace-max-bytes): replay runs the first, up to its end, and stops there")
        # a recording of version 5 or later cut before its first step ended holds an empty schedule: follow it
        version = tf.meta.get("version")
        self.follow = bool(self.rec.items) or (self.rec_cut and type(version) is int and version >= 5)
        if self.cut is None and self.follow and self.rec_cut:
            self.cut = self._cut_loss(run)
            how = "the trace has no end record" if complete is False else "its schedule holds no stop"
            self.notes.append(f"the recording ends without the actor being stopped (its process was killed: {how}): "
                              "the replay runs what it holds and stops where it ends" + self._render_loss())
        if self.rec.drops:
            self.notes.append(f"the recording dropped {self.rec.drops} undecodable message(s); replay cannot "
                              "feed those")
        if not self.follow:
            self.notes.append("the recording holds no schedule (recorded before trace version 5): the actor's "
                              "concurrent tasks run in the order the replay's timing gives, which may differ from "
                              "the run's")
        self.outs: list[Out] = []
        self.replay_handled: dict[str, dict] = {}
        self.fed = 0
        self.served_replies = 0
        self.served_inputs = 0
        self.stopped: str | None = None
        # set when the replay stops the actor after the recording's last event: what the stop itself causes (a
        # handler still waiting, cancelled, and its error reply) is compared only where the recording has it too
        self.final_stop_vt: float | None = None
        self.network: list[str] = []
        self.schedule_findings: list[Finding] = []
        self._inputs: dict[str, deque] = {}
        for e in self.rec.inputs:
            self._inputs.setdefault(e.name or "?", deque()).append(e)
        self._used_inputs: set[int] = set()
        self._unmatched: dict[tuple, list[Event]] = {}
        self._replies_by_re: dict[str, Event] = {}
        self._own_ids = {e.id for e in self.rec.outbound}
        for e in self.rec.outbound:
            if e.kind in ("reply", "error"):
                self._replies_by_re[e.header.get("re", "")] = e
            else:
                self._unmatched.setdefault((e.header.get("to"), e.method, e.header.get("parent")), []).append(e)
        self._matched_rec: dict[int, Out] = {}   # offset of a recorded send -> its replayed counterpart
        self.loop: asyncio.AbstractEventLoop | None = None
        self.clock: VirtualClock | None = None
        self.sched: ReplaySchedule | None = None   # the recorded schedule, followed (None: the recording has none)
        self.delivered: list[Event] = []            # inbound messages fed, in the order fed
        self.config: dict = {}
        self.fwd_map: list[tuple[str, str]] = []  # recorded path prefix -> replay path prefix
        self.run_dir = self.workdir / "run"         # the replay's run directory, as the actor's runtime gives it
        self.actor = None

    def _cut_loss(self, run: TraceRun) -> dict:
        """What a killed actor sent that its trace lost (the writer's last batch): the messages its peers' traces
        received from this process (ids of its prefix) that its own holds no send record of."""
        tf = self.rec.file
        end = max([e.t_ns for e in tf.events] + [st.t_ns for st in tf.schedule] + [self.rec.t0])
        sent = {e.id for e in tf.events if e.ev == "send"}
        prefixes = {i[:8] for i in sent if isinstance(i, str) and len(i) > 8}
        lost: dict[str, int] = {}
        times = []
        if prefixes:
            for f in run.files:
                if f is tf:
                    continue
                for e in f.events:
                    h = e.header
                    if e.ev != "recv" or h is None or h.get("from") != self.rec.actor:
                        continue
                    mid = h.get("id", "")
                    if mid[:8] in prefixes and mid not in sent:
                        key = f"{h.get('to')}.{h.get('method')}" if h.get("kind") in ("tell", "ask") \
                            else f"{h.get('kind')} to {h.get('method')}"
                        lost[key] = lost.get(key, 0) + 1
                        times.append(e.t_ns)
        return {"why": "killed", "t_ns": end, "lost_sends": sum(lost.values()), "lost_by_method": lost,
                "lost_within_ms": round((max(times) - end) / 1e6, 3) if times else 0.0}

    def _render_loss(self) -> str:
        c = self.cut or {}
        n = c.get("lost_sends", 0)
        if not n:
            return "; its peers' traces hold no message from it that its own lacks"
        what = ", ".join(f"{k} x{v}" for k, v in sorted(c["lost_by_method"].items()))
        return (f"; {n} message(s) its peers received from it are not in its trace ({what}): sent in its last "
                f"{c['lost_within_ms']:g} ms, whose records the trace writer had not yet written (it writes every "
                "50 ms) when the process died")

    # ---------------------------------------------------------------------------------------- building the actor
    def _actor_class(self):
        from ..launch.roles import actor_class
        target = self.rec.meta.get("actor_class")
        if not target:
            raise ReplayError(f"{self.rec.file.path}: the trace header has no actor_class (recorded by an actor "
                              "without trace_meta?); replay cannot build it")
        try:
            return actor_class(target)
        except Exception as exc:
            raise ReplayError(f"cannot load the recorded actor class {target!r}: {exc}") from None

    def _build_config(self) -> dict:
        """The actor's recorded config, its job config read through JobConfig (as the actor read it) and edited
        there for the replay: flags the recording predates, the --set overrides, W&B off, the paths mapped to the
        replay's directory. `args` becomes the edited JobConfig (`Actor.for_job` builds the actor from it)."""
        cfg = self.rec.meta.get("config")
        if not isinstance(cfg, dict):
            raise ReplayError(f"{self.rec.file.path}: the trace header has no actor config")
        cfg = json.loads(json.dumps(cfg))  # a private copy
        args = cfg.get("args")
        if args is None:
            if self.overrides:
                raise ReplayError("--set: this actor's recorded config has no job flags")
            return cfg
        try:
            job = JobConfig.from_dict(args, source=f"{self.rec.file.path}: the recorded job config")
            for k, v in BEFORE_FLAG.items():  # recorded before the flag existed: it behaves as it did then
                if k not in args:
                    job.set(k, v, "a flag the recording predates")
            for k, v in self.overrides.items():
                if k not in FIELDS:
                    raise ReplayError(f"--set {k}: the recorded job has no flag {k!r}")
                job.set(k, v, f"--set {k}")
            job.validate()
        except ConfigError as exc:
            raise ReplayError(str(exc)) from None
        if job.train.n_ranks > 1 and self.role == "trainer":
            raise ReplayError("replaying one rank of a multi-rank trainer group is not supported: its "
                              "collectives (gradient all-reduce) need the other ranks")
        self._map_paths(job)
        cfg["args"] = job
        return cfg

    def _map_paths(self, job: JobConfig) -> None:
        if job.logging.use_wandb:   # a replay must not log into the run's W&B project (nor reach its server)
            job.logging.use_wandb = False
            self.notes.append("--use-wandb turned off: a replay logs to no W&B run")
        for old, new in self.user_map:
            self.fwd_map.append((old, new))
        if job.run.run_dir:
            self.fwd_map.append((str(Path(job.run.run_dir)), str(self.workdir / "run")))
        runtime = self.rec.meta.get("runtime")
        reached = runtime.get("run_dir") if isinstance(runtime, dict) else None
        if isinstance(reached, str) and reached and reached != str(Path(job.run.run_dir or "")):
            # the run directory as the process reached it (the launcher resolves a relative --run-dir): the paths
            # the actor made from it map back to it, those made from --run-dir to the flag's form -- the same
            # directory under two names (a link)
            self.run_dir = self.workdir / "run-as-reached"
            self.fwd_map.append((reached, str(self.run_dir)))
        outputs = {"save": job.checkpoint.save, "save_hf": job.checkpoint.save_hf,
                   "update_weight_disk_dir": job.weights.update_weight_disk_dir,
                   "save_debug_rollout_data": job.debug.save_debug_rollout_data}
        for k, v in outputs.items():
            if v:
                base = os.path.dirname(v) if "{" in v else v
                if base:
                    self.fwd_map.append((base, str(self.workdir / f"out-{k}")))
        ckpt = job.model.hf_checkpoint
        if ckpt and not Path(self._fwd(ckpt)).exists():
            made = _remake_checkpoint(ckpt)
            if made is not None:
                self.fwd_map.append((ckpt, made))
                self.notes.append(f"hf_checkpoint {ckpt} is not here: made it again at {made}")
        job.map_strings(self._fwd)

    def _fwd(self, s: str) -> str:
        return _map_prefix(s, self.fwd_map)

    def _back(self, s: str) -> str:
        return _map_prefix(s, [(new, old) for old, new in self.fwd_map])

    # ---------------------------------------------------------------------------------------- time
    def vt(self, t_ns: int) -> float:
        return (t_ns - self.rec.t0) / 1e9

    def t_of(self, vt: float) -> int:
        return self.rec.t0 + int(vt * 1e9)

    async def sleep_until(self, t_ns: int) -> None:
        d = self.vt(t_ns) - self.loop.time()
        if d > 0:
            await asyncio.sleep(d)

    async def unless_last(self) -> None:
        """At an external call whose answer the recording lacks: if the recording ends with the calling task waiting
        in it (a process killed mid-run), the call never returns (stopping the actor cancels it)."""
        s = self.sched
        st = _schedule.current()
        if s is None or s.free or st is None or st.sched is not s or s.next_of.get(st.id):
            return
        await self.loop.create_future()

    async def turn(self, call: str, recorded: Event | None = None) -> str:
        """The end of the stand-in of external call `call`: its task's recorded resumption (ReplaySchedule.turn)."""
        if self.sched is None:
            return FREE
        return await self.sched.turn(call, recorded)

    def recording_over(self) -> None:
        if self.final_stop_vt is None:
            self.final_stop_vt = self.loop.time()

    def stop_as_recorded(self) -> None:
        """The recording says the actor was stopped here from outside its tasks (a signal, the process hosting it)."""
        self.notes.append(f"the recording stops the actor at +{self.loop.time():.3f}s (from outside its tasks: a "
                          "signal or its host); so does the replay")
        self.loop.create_task(self.actor.stop("stopped, as in the recording"))

    def schedule_diverged(self, it: "Item | None", why: str) -> None:
        t = it.t_ns if it is not None else self.t_of(self.loop.time())
        self.schedule_findings.append(Finding(t, "schedule", f"the replay left the recorded schedule: {why}"))
    # ---------------------------------------------------------------------------------------- inputs and replies
    def has_input(self, name: str, key: str | None) -> bool:
        q = self._inputs.get(name)
        return bool(q) and (key is None or any((e.extra or {}).get("key") == key for e in q))

    def take_input(self, name: str, key: str | None) -> tuple[Any, int]:
        value, ev = self.take_input_event(name, key)
        return value, ev.t_ns

    def take_input_event(self, name: str, key: str | None) -> tuple[Any, Event]:
        q = self._inputs.get(name)
        if not q and self.final_stop_vt is not None:
            # stopping after the recording ended: what the actor does now was never recorded (nor is it compared)
            raise ReplayOver(f"{self.rec.actor} read input {name!r} while replay stopped it, after the recording")
        if not q and self.rec_cut and (self.sched is None or self.sched.head >= len(self.sched.items)) and \
                any(e.name == name for e in self.rec.inputs):
            # a recording cut short (a kill) with nothing left to follow: this reading's record was lost with the
            # process, or was never taken -- the replay has reached the cut; nothing from here on is compared
            self.recording_over()
            raise ReplayOver(f"{self.rec.actor} read input {name!r} past the end of its cut recording")
        if not q:
            if not any(e.name == name for e in self.rec.inputs):
                raise self.gap(f"the actor read input {name!r}, and the recording holds none: it was recorded "
                               "before slime-actors kept that input in traces; record the run again")
            raise self.gap(f"the actor read input {name!r} more often than the recording did "
                           f"({sum(1 for e in self.rec.inputs if e.name == name)} recorded): it diverged earlier")
        ev = None
        if key is None:
            ev = q.popleft()
        else:
            for i, e in enumerate(q):
                if (e.extra or {}).get("key") == key:
                    ev = e
                    del q[i]
                    break
            if ev is None:
                raise self.gap(f"the actor asked for input {name!r} with key {key} (another request than any "
                               "recorded one): it diverged earlier, or its configuration differs")
        self.served_inputs += 1
        try:
            return ev.body(), ev
        except TraceFormatError as exc:
            raise self.gap(str(exc)) from None

    def reply_value(self, reply: Event, ask: Event) -> Any:
        from ..mailbox import codec
        self.served_replies += 1
        what = f"the reply to {ask.method} (ask {ask.id} to {ask.header.get('to')})"
        if reply.omitted:
            # an actor may keep such a reply in full as an input named after the method (the trainer's batch)
            q = self._inputs.get(ask.method)
            if q:
                ev = q.popleft()
                value = ev.body()
                if isinstance(value, dict) and value.get("__omitted__"):
                    raise self.gap(f"{what} was not kept: {value.get('size')} bytes, "
                                   f"{value.get('why', 'over the limit')}; raise SLIME_ACTORS_TRACE_BATCH_LIMIT")
                self.served_inputs += 1
                return value
            raise self.gap(f"{what} was recorded by size and checksum only ({reply.body_size} bytes, over the "
                           f"trace's body limit of {self.rec.meta.get('body_limit')} bytes); record with "
                           f"SLIME_ACTORS_TRACE_BODY_LIMIT={_pow2_above(reply.body_size)} to replay this actor")
        return self._decode(reply, what, codec)

    def _decode(self, ev: Event, what: str, codec) -> Any:
        frames = []
        for a in ev.arrays or ():
            if a[5] is None:
                raise self.gap(f"{what} carries {len(ev.arrays)} array(s) recorded by checksum only; record with "
                               "--trace-keep-arrays (SLIME_ACTORS_TRACE_KEEP_ARRAYS=1) to replay this actor")
            frames.append(a[5])
        try:
            return codec.decode_body(ev.body_raw, frames)
        except Exception as exc:
            raise self.gap(f"{what}: recorded body does not decode ({ev.file} at byte {ev.offset}): {exc}") from None

    def gap(self, why: str) -> ReplayGap:
        if self.stopped is None:
            self.stopped = why
        return ReplayGap(why)

    # ---------------------------------------------------------------------------------------- outbound
    def sent(self, kind: str, to: str, method: str, body: Any, re: str | None) -> Out:
        from ..mailbox import codec
        from ..mailbox.mailbox import current_cause
        cause = current_cause.get()
        parent = cause[1] if cause is not None and kind in ("tell", "ask") else (re if re else None)
        try:
            raw, buffers, refs = codec.encode_body(body)
        except TypeError as exc:
            raw, buffers, refs = codec.encode_body({"__unencodable__": str(exc)})
        keep = bool(self.rec.meta.get("keep_arrays"))
        algo = self.digest_algo
        arrays = [[r.dtype, list(r.shape), r.kind, r.nbytes, digest(b, algo), bytes(b) if keep else None]
                  for r, b in zip(refs, buffers)]
        decoded = _map_strings(decode_recorded_body(raw, arrays), self._back)
        if self.fwd_map:  # the checksum of what the recorded actor would have sent
            raw = codec.encode_body(_map_strings(codec.decode_body(raw, buffers) if buffers else
                                                 msgpack.unpackb(raw, raw=False, strict_map_key=False),
                                                 self._back))[0]
        out = Out(kind, to, method, decoded, digest(raw, algo), parent if kind in ("tell", "ask") else None, re,
                  self.loop.time(), f"replay-{len(self.outs) + 1}")
        out.after_end = self.final_stop_vt is not None
        if self.rec_cut and self.sched is not None and not out.after_end:
            # a cut recording (its process killed): the task's last recorded step made this call, and what the call
            # sent may have left after the cut (an ask waits for its peer's address inside the call)
            st = _schedule.current()
            out.at_cut = st is not None and not self.sched.next_of.get(st.id)
        self.outs.append(out)
        if kind in ("reply", "error"):
            out.matched = self._replies_by_re.pop(re or "", None)
        else:
            out.matched = self._match_request(out)
        return out

    def _match_request(self, out: Out) -> Event | None:
        """The recorded request this one stands for: same receiver, method and cause; among several, the first
        about the same thing (rollout_id, work_id, sample indices... -- concurrent work may go out in another
        order), else the first in recorded order."""
        from .diff import body_ident
        cands = self._unmatched.get((out.to, out.method, out.parent))
        if not cands:
            return None
        want = body_ident(out.body)
        pick = None if out.after_end and want else 0
        if want:
            for i, e in enumerate(cands):
                try:
                    if body_ident(e.body()) == want:
                        pick = i
                        break
                except TraceFormatError:
                    continue
        # (what the replay sends past the recording's end stands only for a recorded request about the same thing)
        return None if pick is None else cands.pop(pick)

    # ---------------------------------------------------------------------------------------- delivering
    def deliver(self, ev: Event) -> None:
        from ..mailbox.mailbox import Inbound
        h = dict(ev.header)
        what = f"{h.get('kind')} {h.get('method')} from {h.get('from')} (id {h.get('id')})"
        if ev.omitted:
            raise self.gap(f"inbound {what}: its body was recorded by size and checksum only ({ev.body_size} "
                           f"bytes, over the trace's body limit of {self.rec.meta.get('body_limit')} bytes); record "
                           f"with SLIME_ACTORS_TRACE_BODY_LIMIT={_pow2_above(ev.body_size)} to replay this actor")
        frames = []
        from ..messages import CATALOG
        spec = CATALOG.get((getattr(self.actor, "role", None), h.get("method")))
        for a in ev.arrays or ():
            if a[5] is None and spec is not None and not spec.replay_arrays:
                frames.append(bytes(int(a[3])))   # its handler does not read them when replaying: zeros
                continue
            if a[5] is None:
                raise self.gap(f"inbound {what} carries array(s) recorded by checksum only; record with "
                               "--trace-keep-arrays (SLIME_ACTORS_TRACE_KEEP_ARRAYS=1) to replay this actor")
            frames.append(a[5])
        raw = ev.body_raw if ev.body_raw is not None else b"\xc0"
        if self.fwd_map and any(old.encode() in raw for old, _ in self.fwd_map):
            raw = _map_raw(raw, self._fwd)
        self.fed += 1
        self.delivered.append(ev)
        self.actor.mailbox.stats["received"] += 1
        self.actor.mailbox.on_request(Inbound(h, msgpack.packb(h, use_bin_type=True), raw, frames, b"replay"))

    async def drive(self, start_task: asyncio.Task) -> None:
        inbound = self.rec.inbound
        if self.sched is not None:
            # the schedule delivers the inbound messages in their place among the steps (ReplaySchedule._pump)
            start_task.add_done_callback(lambda t: t.cancelled() or t.exception() is None or self.sched._over())
            self.sched.start()
            await asyncio.shield(self.sched.done)
            if start_task.done() and not start_task.cancelled() and start_task.exception() is not None:
                return
            # given up: what the recording still holds is delivered at its recorded times
            inbound = [it.event for it in self.rec.items[self.sched.head:] if it.kind == INBOUND]
        for ev in inbound:
            if self.stopped:
                break
            await self.sleep_until(ev.t_ns)
            if start_task.done() and start_task.exception() is not None:
                return
            try:
                self.deliver(ev)
            except ReplayGap:
                break
        if not self.stopped:
            await self.sleep_until(self.rec.end)
        # the recorded actor ended here: let what is still running finish the way it does on stop
        if start_task.done() and start_task.exception() is None:
            if self.final_stop_vt is None:  # (a recording followed to its end set it there already)
                self.final_stop_vt = self.loop.time()
            await self.actor.stop("replay over")
        else:
            start_task.cancel()

    async def main(self) -> None:
        from ..runtime import RuntimeConfig
        from ..mailbox.mailbox import MailboxConfig
        cls = self._actor_class()
        self.config = self._build_config()
        config = dict(self.config)
        job = config.pop("args", None)
        self.actor = cls.for_job(self.index, job, **config) if job is not None else cls(self.index, **config)
        (self.workdir / "run").mkdir(parents=True, exist_ok=True)
        if self.run_dir != self.workdir / "run" and not self.run_dir.exists():
            self.run_dir.symlink_to("run")
        recorded = self.rec.meta.get("runtime") if isinstance(self.rec.meta.get("runtime"), dict) else {}
        mb = MailboxConfig(**{k: recorded[k] for k in ("max_concurrency", "default_timeout") if k in recorded})
        # an actor that registered with a directory does so again (the directory's recorded answers)
        directory = "replay://directory/0" if self.rec.registered and self.rec.actor != "directory/0" else None
        rt = RuntimeConfig(run_dir=str(self.run_dir), directory=directory, curve=False, trace=True,
                           trace_body_limit=int(self.rec.meta.get("body_limit", 65536)),
                           trace_keep_arrays=bool(self.rec.meta.get("keep_arrays")),
                           heartbeat_interval=float(recorded.get("heartbeat_interval", 3600.0)),
                           liveness=int(recorded.get("liveness", 5)),
                           transport=recorded.get("transport", "ipc"), mailbox=mb)
        if self.follow:
            self.sched = ReplaySchedule(self, self.rec.items)
            self.clock.schedule = self.sched
        start_task = self.loop.create_task(self.actor.start(rt, endpoint="replay://", host=ReplayHost(self)))
        await self.drive(start_task)
        if start_task.done() and not start_task.cancelled() and start_task.exception() is not None:
            exc = start_task.exception()
            if isinstance(exc, ReplayOver) and self.rec_cut:
                return  # the recording was cut while the actor was starting: it ends there
            if isinstance(exc, ReplayError):
                raise exc
            raise ReplayError(f"{self.rec.actor} could not start from its recorded configuration: "
                              f"{type(exc).__name__}: {exc} (paths in the recording may need --path-map OLD=NEW, "
                              "or run from the directory the job ran in)")
        await asyncio.sleep(0)

    # ---------------------------------------------------------------------------------------- running
    @contextlib.contextmanager
    def _sandbox(self):
        """No network, no distributed environment of the shell replay runs in (the actor's mailbox, recorder,
        clock and schedule are the ReplayHost's)."""
        harness = self
        env_saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                    "MASTER_PORT") if k in os.environ}
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        conn, conn_ex = socket.socket.connect, socket.socket.connect_ex
        if not self.allow_network:
            def refuse(sock, address, *a):
                harness.network.append(str(address))
                raise ReplayNetworkError(f"replay: {harness.rec.actor} tried to connect to {address}; a replayed "
                                         "actor gets what it receives from the recording")
            socket.socket.connect = refuse
            socket.socket.connect_ex = refuse
        try:
            yield
        finally:
            socket.socket.connect, socket.socket.connect_ex = conn, conn_ex
            os.environ.update(env_saved)

    def run(self) -> Report:
        loop = asyncio.SelectorEventLoop()  # a stock loop (not uvloop): its clock and selector can be virtual
        self.loop = loop
        self.clock = VirtualClock(loop, 0.0, self.timeout)
        _schedule.install(loop)
        try:
            with self._sandbox():
                try:
                    loop.run_until_complete(self.main())
                finally:
                    _cancel_all(loop)
        finally:
            loop.close()
            if self._tmp:
                shutil.rmtree(self.workdir, ignore_errors=True)
        return self._report()

    # ---------------------------------------------------------------------------------------- comparing
    def _describe(self, e: Event) -> str:
        h = e.header
        if h.get("kind") in ("reply", "error"):
            return f"{h['kind']} to {h.get('method')} from {h.get('to')} (recorded id {h.get('id')}, re {h.get('re')})"
        return f"{h.get('kind')} {h.get('to')}.{h.get('method')} (recorded id {h.get('id')})"

    def _report(self) -> Report:
        findings: list[Finding] = []
        fsum = FloatSummary()
        matched = {id(o.matched): o for o in self.outs if o.matched is not None}
        end_vt = self.loop.time() if self.loop else 0.0
        compared = 0
        inbound_ids = {ev.id for ev in self.rec.inbound}
        for e in self.rec.outbound:
            o = matched.get(id(e))
            if o is None:
                if self.stopped and self.vt(e.t_ns) > end_vt:
                    continue  # after the replay stopped: not a difference
                if self.rec_cut and self.rec.items and e.offset > self.rec.items[-1].offset:
                    continue  # sent in a step whose own record the cut lost: the replay stops before it
                if e.kind == "ask" and e.header.get("method") in ADDRESS_ASKS:
                    continue  # (routing, asked inside a recorded call the replay serves whole)
                cause = e.header.get("re") if e.kind in ("reply", "error") else e.header.get("parent")
                if self.rec_cut and cause and cause not in inbound_ids and cause not in self._own_ids:
                    # sent while handling a request whose record the cut lost (a synchronous handler's request is
                    # written after its reply): the replay never received it
                    continue
                findings.append(Finding(e.t_ns, "missing", f"{self._describe(e)} was not sent by the replay",
                                        rec_id=e.id))
                continue
            compared += 1
            if o.kind != e.kind:
                findings.append(Finding(e.t_ns, "differs", self._describe(e),
                                        Difference("kind", e.kind, o.kind), e.id))
                continue
            if e.omitted:
                if e.body_hash != o.checksum:
                    findings.append(Finding(e.t_ns, "differs", self._describe(e) + " (the recording kept only "
                                            "the body's checksum)", Difference("checksum", e.body_hash, o.checksum),
                                            e.id))
                continue
            try:
                rb = e.body()
            except TraceFormatError as exc:
                findings.append(Finding(e.t_ns, "differs", f"{self._describe(e)}: {exc}", rec_id=e.id))
                continue
            leaves = leaf_differences(rb, o.body, volatile=self.volatile)
            if leaves:
                logic = [x for x in leaves if x.kind == LOGIC]
                floats = [x for x in leaves if x.kind != LOGIC]
                if floats:
                    fsum.add(self._describe(e), floats, self.rtol, self.atol)
                if logic:
                    d = logic[0]
                    findings.append(Finding(e.t_ns, "differs", self._describe(e), Difference(d.path, d.a, d.b), e.id,
                                            e.header.get("re")))
                else:
                    beyond = [d for d in floats if not d.within(self.rtol, self.atol)]
                    if beyond:
                        d = beyond[0]
                        findings.append(Finding(e.t_ns, "differs", self._describe(e), Difference(d.path, d.a, d.b),
                                                e.id, e.header.get("re"), kind="float"))
        lost = at_cut = 0
        for o in self.outs:
            if o.matched is None:
                if o.kind in ("reply", "error") and o.re in self.rec.handled and self.sched is not None:
                    lost += 1  # its handler ended in the recording, but no reply went out: the asker was gone
                    continue
                if o.at_cut:
                    at_cut += 1
                    continue
                if o.after_end and (o.kind == "error" or self.sched is not None):
                    # after the recording ended (every recorded step replayed), or the error reply of a handler the
                    # final stop cancelled: the recording does not have it
                    continue
                what = (f"{o.kind} to {o.method} for {o.to} (re {o.re})" if o.kind in ("reply", "error")
                        else f"{o.kind} {o.to}.{o.method}")
                findings.append(Finding(self.t_of(o.vt), "extra", f"{what}: sent by the replay, not in the recording",
                                        Difference("", "<not sent>", o.body)))
        outcomes = 0
        for ev in self.delivered:
            rec_h = self.rec.handled.get(ev.id)
            rep = self.replay_handled.get(ev.id)
            if rec_h is None and (rep is None or rep.get("_at_final_stop")):
                continue
            outcomes += 1
            ro = (rec_h.extra or {}).get("outcome") if rec_h is not None else "not handled"
            po = rep.get("outcome") if rep is not None else "not handled"
            norm = {"cached": "ok"}
            if norm.get(ro, ro) != norm.get(po, po):
                why_r = (rec_h.extra or {}).get("error", "") if rec_h is not None else ""
                why_p = (rep or {}).get("error", "")
                # (at the time the recorded handling ended: after whatever made it end otherwise)
                findings.append(Finding(rec_h.t_ns if rec_h is not None else ev.t_ns, "outcome",
                                        f"handling {ev.kind} {ev.method} from "
                                        f"{ev.header.get('from')} (recorded id {ev.id})",
                                        Difference("outcome", f"{ro} {why_r}".strip(), f"{po} {why_p}".strip()),
                                        ev.id))
        if at_cut:
            self.notes.append(f"{at_cut} message(s) the replay sent from the last recorded step of their task are not "
                              "in the recording, which was cut there: not compared")
        if lost:
            self.notes.append(f"{lost} repl(y/ies) the recording could not deliver (the asker was gone) were not "
                              "compared")
        from .query import run_start_ns
        t0 = run_start_ns(self.run_)  # times as `trace show` prints them
        if self.sched is not None and self.sched.skipped:
            self.notes.append(f"{self.sched.skipped} recorded step(s) of task(s) that ended sooner in the replay were "
                              "skipped (its code differs from the recorded run's)")
        findings.extend(self.schedule_findings)  # (where the replay left the schedule: the cause of what follows)
        findings.sort(key=lambda f: f.t_ns)
        if self.network:
            self.notes.append(f"the actor tried to reach the network {len(self.network)} time(s) (first: "
                              f"{self.network[0]}); those calls failed")
        steps = self._train_steps() if self.role == "trainer" else []
        counts = {"inbound": self.fed, "replies": self.served_replies, "inputs": self.served_inputs,
                  "compared": compared, "outcomes": outcomes}
        recorded_env = recorded_environment(self.rec.file)
        env_diffs = None if recorded_env is None else _env.differences(recorded_env, _env.here())
        return Report(self.rec.actor, str(self.rec.file.path), str(self.rec.meta.get("actor_class")),
                      not findings and not self.stopped and not fsum.values, findings, self.stopped, counts,
                      self.notes, t0, steps, fsum, self.rtol, self.atol, env_diffs, self.cut)

    def _train_steps(self) -> list[dict]:
        out = []
        by_re = {o.re: o for o in self.outs if o.kind == "reply" and o.method == "train"}
        for e in self.rec.outbound:
            if e.kind == "reply" and e.method == "train":
                try:
                    rb = e.body()
                except TraceFormatError:
                    continue
                req = next((x for x in self.rec.inbound if x.id == e.header.get("re")), None)
                rid = (req.body() or {}).get("rollout_id") if req is not None else None
                o = by_re.get(e.header.get("re"))
                out.append({"rollout_id": rid, "recorded": rb if isinstance(rb, dict) else {},
                            "replayed": o.body if o is not None and isinstance(o.body, dict) else {}})
        return out


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def _pow2_above(n: int) -> int:
    p = 65536
    while p < n:
        p *= 2
    return p


def _map_prefix(s: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        if old and (s == old or s.startswith(old.rstrip("/") + "/")):
            return new + s[len(old):]
    return s


def _map_strings(v: Any, fn) -> Any:
    if isinstance(v, str):
        return fn(v)
    if isinstance(v, dict):
        return {(_map_strings(k, fn) if isinstance(k, str) else k): _map_strings(x, fn) for k, x in v.items()}
    if isinstance(v, list):
        return [_map_strings(x, fn) for x in v]
    return v


def _map_raw(raw: bytes, fn) -> bytes:
    value = msgpack.unpackb(raw, raw=False, strict_map_key=False, ext_hook=lambda c, d: msgpack.ExtType(c, d))
    return msgpack.packb(_map_strings(value, fn), use_bin_type=True)


def _remake_checkpoint(path: str) -> str | None:
    """A tiny:NAME or smollm2 model directory that is not on this machine: make it again (they are made locally,
    deterministically)."""
    name = Path(path).name
    spec = None
    if name.startswith("tiny-"):
        spec = "tiny:" + name[len("tiny-"):]
    elif name == "smollm2-135m-instruct":
        spec = "smollm2:135m"
    if spec is None:
        return None
    from ..models.resolve import model_cache, resolve_checkpoint
    try:
        return resolve_checkpoint(spec, model_cache())
    except Exception as exc:
        log.warning("could not make the model again", spec=spec, error=repr(exc))
        return None


def parse_sets(items: list[str]) -> dict:
    out = {}
    for it in items or ():
        if "=" not in it:
            raise ReplayError(f"--set {it!r}: expected KEY=VALUE (VALUE as JSON, else a string)")
        k, _, v = it.partition("=")
        k = k.strip().lstrip("-").replace("-", "_")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def parse_path_maps(items: list[str]) -> list[tuple[str, str]]:
    out = []
    for it in items or ():
        if "=" not in it:
            raise ReplayError(f"--path-map {it!r}: expected OLD=NEW")
        old, _, new = it.partition("=")
        out.append((old, new))
    return out


def replay(run: TraceRun | str, actor: str, **kw) -> Report:
    """Replay `actor` (role/index) of a recorded run; see the module docstring."""
    if not isinstance(run, TraceRun):
        run = TraceRun(run)
    return Harness(run, actor, **kw).run()
