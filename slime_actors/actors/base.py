"""The Actor class: declared handlers, lifecycle hooks, a name `role/index`, a mailbox, heartbeats, a trace file.

    class Echo(Actor):
        role = "echo"

        @handler
        def echo(self, text: str) -> str:         # plain function: runs inline, in arrival order, must be quick
            return text

        @handler
        async def slow(self, n: int) -> int:      # coroutine: runs as a task, many at once (max_concurrency)
            reply = await self.ask("other/0", "work", {"n": n})
            return reply + 1

    actor = Echo(index=0)
    await actor.start(RuntimeConfig(...))          # binds, registers with the directory, starts heartbeats
    await actor.ask("echo/1", "echo", {"text": "hi"}, timeout=5)

Messages sent while a handler runs are caused by the message it handles: they carry its trace id and its id as
their parent, so a trace shows the causal chain. How a request reaches its handler (checks, idempotency, tracing)
is the receiving half, actors/dispatch.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Coroutine, Mapping
from typing import Any, ClassVar

from .. import heapwatch
from ..config import JobConfig
from ..log import get_logger
from ..mailbox.errors import MailboxError, PeerDown, UnknownPeer
from ..mailbox.mailbox import Mailbox
from ..mailbox.tracing import fast_entries
from ..messages import CATALOG, MessageSpec, check_handler, spec_from_signature
from ..role_handles import DirectoryHandle
from ..runtime import RuntimeConfig
from ..recorder.writer import trace_file_name
from . import schedule as _sched
from .dispatch import Dispatch
from .host import LOCAL, Host

DIRECTORY = "directory/0"

# external calls (slime_actors/actors/schedule.py): what happens inside them is not the actor's schedule
for _fn in (Mailbox.ask, Mailbox.tell, Mailbox.reply, Mailbox.heartbeat):
    _sched.external(_fn)


def handler(fn=None, *, name: str | None = None):
    """Mark a method as a message handler. Its parameters are the body's fields; its return value is the reply.

    Arrays in a body arrive without a copy: a numpy array is a read-only view of the received frame (`.copy()` it to
    change it), a torch tensor a writable one (docs/wire-format.md, *Arrays: ext type 1*)."""
    def mark(f):
        f._slime_handler = name or f.__name__
        return f
    return mark(fn) if fn is not None else mark


class _Handler:
    __slots__ = ("fn", "spec", "is_async")

    def __init__(self, fn, spec: MessageSpec):
        self.fn, self.spec = fn, spec
        self.is_async = inspect.iscoroutinefunction(fn)


# True while a recorded call (`Actor.recorded_async`) runs in this task (and in the tasks it starts): what it calls
# that is itself recorded -- an environment step's retrieval, its engine calls, the clock its retries read -- is
# not recorded again. A replay serves the outer call's answer without running it, so inner inputs would never be
# taken, and unkeyed ones (clock readings) would be served to the wrong readers.
IN_RECORDED_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("slime_actors_in_recorded_call",
                                                                        default=False)


class Actor(Dispatch):
    """Base class of every actor. Subclasses set `role` and declare handlers with @handler.

    The job's config: `job`, a JobConfig, when the caller has it typed (the launcher, which read and checked the job
    file; `Actor.for_job` builds an actor so), else `args`, its flat dict (a test's; what a recording holds), read
    here once into `self.cfg` (ConfigError naming the field when it is malformed). `args` is also what the trace
    records and what an actor class of a user's may read itself (docs/adding-a-reward-actor.md). Without either,
    `self.cfg` holds the defaults -- unless the class sets `needs_job` (the roles of a training job)."""

    role: ClassVar[str] = "actor"
    needs_job: ClassVar[bool] = False
    _handlers: ClassVar[dict[str, _Handler]] = {}
    endpoint: str          # where its mailbox is bound (start())
    _stopped: asyncio.Event

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        handlers: dict[str, _Handler] = {}
        for klass in reversed(cls.__mro__):
            for attr, fn in vars(klass).items():
                method = getattr(fn, "_slime_handler", None)
                if method is None:
                    continue
                spec = CATALOG.get((cls.role, method)) or CATALOG.get(("*", method))
                if spec is not None:
                    check_handler(spec, fn)
                else:
                    spec = spec_from_signature(cls.role, method, fn)
                handlers[method] = _Handler(fn, spec)
        cls._handlers = handlers

    def __init__(self, index: int = 0, args: Mapping[str, Any] | None = None, *, job: JobConfig | None = None,
                 **config: Any):
        self.index = index
        self.name = f"{self.role}/{index}"
        if job is not None:
            self.cfg = job
        elif args is not None:
            self.cfg = JobConfig.from_dict(args, source=f"{self.name}'s job config")
        elif self.needs_job:
            raise ValueError(f"{self.name}: a {type(self).__name__} needs the job's config (job= or args=)")
        else:
            self.cfg = JobConfig()
        if args is None and job is not None:
            args = job.to_dict()
        # what the trace records to build the actor again (replay): the flat job config in "args"
        self.config = config if args is None else {"args": args, **config}
        self.log = get_logger(actor=self.name)
        # (self.runtime, self.mailbox: set by start())
        self.host: Host = LOCAL  # mailbox, recorder, clock, schedule, threads: Actor.start(host=...)
        self.tracer: Any = None  # the trace writer (TraceWriter; under replay its stand-in), once started traced
        self._schedule: _sched.Schedule | None = None  # the order its tasks run in, recorded with its trace
        self._clock_time = time.time  # the host's clock (deadlines)
        self.started_at = time.time()
        self.counters = {"handled": 0, "failed": 0, "bad_requests": 0, "unknown_method": 0, "expired": 0}
        self._busy = 0
        self._tasks: set[asyncio.Task] = set()
        self._idem: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._idem_max = 4096
        self._running = False
        self._loop: asyncio.AbstractEventLoop | None = None   # (start: the loop the actor runs on)
        self._trace = None  # the trace writer's queue append, once started with tracing on
        self._tpack = None  # ... and its packer for records of bytes (the event loop thread's own)
        self._trec = None  # ... and its queue of packed records (TraceWriter.rec)
        self._tlimit = -1

    @classmethod
    def for_job(cls, index: int, job: JobConfig, **config: Any) -> Actor:
        """An actor of this class for the job: its typed config, and its flat form for an actor class that reads
        `args` itself (and for the trace)."""
        return cls(index, args=job.to_dict(), job=job, **config)

    # ------------------------------------------------------------------------------------------ hooks
    async def on_start(self) -> None:
        """Called once the mailbox is bound and registered, before heartbeats report the actor alive."""

    async def on_stop(self) -> None:
        """Called when the actor stops, before its mailbox closes (peers can still be told things)."""

    async def on_peer_down(self, name: str, reason: str) -> None:
        """Called when the directory declares a peer down (missed heartbeats, or it stopped)."""

    async def on_peer_up(self, name: str, endpoint: str) -> None:
        """Called when a peer (re)registers."""

    def trace_meta(self) -> dict:
        """What the trace file records about this actor, so replay can construct it again."""
        cls = type(self)
        return {"actor_class": f"{cls.__module__}:{cls.__qualname__}", "role": self.role, "index": self.index,
                "config": self.config}

    # ------------------------------------------------------------------------------------------ lifecycle
    async def start(self, runtime: RuntimeConfig | None = None, *, endpoint: str | None = None,
                    host: Host | None = None) -> str:
        """Bind the mailbox, open the trace file, register with the directory, start heartbeats. `host`: where the
        mailbox, recorder, clock and schedule come from (slime_actors/actors/host.py; replay passes stand-ins)."""
        runtime = runtime or RuntimeConfig.from_env()
        self.runtime = runtime
        if host is not None:
            self.host = host
        host = self.host
        self._clock_time = host.clock.time
        self._stopped = asyncio.Event()
        if runtime.trace:
            path = os.path.join(runtime.run_dir, "traces", trace_file_name(self.name))
            # what replay needs of the runtime to run the actor as it ran (its timers, its limits, the run directory
            # as this process reached it: the launcher resolves --run-dir, and paths made from it go into messages)
            meta = {**self.trace_meta(), "runtime": {
                "heartbeat_interval": runtime.heartbeat_interval, "liveness": runtime.liveness,
                "transport": runtime.transport, "max_concurrency": runtime.mailbox.max_concurrency,
                "default_timeout": runtime.mailbox.default_timeout, "run_dir": str(runtime.run_dir or "")}}
            self.tracer = host.tracer(path, self.name, meta=meta, body_limit=runtime.trace_body_limit,
                                      keep_arrays=runtime.trace_keep_arrays, max_bytes=runtime.trace_max_bytes)
        self.mailbox = host.mailbox(self.name, resolver=self._resolve, keys=runtime.keys(), tracer=self.tracer,
                                    config=runtime.mailbox, on_request=self._on_request, on_drop=self._on_drop)
        self._reply_nowait = self.mailbox.reply_nowait
        # the trace writer's fast entries (TraceWriter.append/pack); None: a tracer without them, use record()
        self._trace, self._tpack, self._trec = fast_entries(self.tracer)
        if self.tracer is not None:
            self._schedule = host.schedule(self)
        if self._trace is not None:
            # requests' recv records are written here, merged with the handled record for synchronous handlers
            self._tlimit = self.tracer.body_limit
            self.mailbox.defer_recv_trace = True
        bound = await self.mailbox.bind(endpoint or runtime.bind_endpoint(self.name))
        self.endpoint = runtime.public_endpoint(bound)
        # requests wait in the socket until on_start has finished: a handler never sees a half-started actor (a
        # restarted buffer that has not restored its state yet, a trainer rank without its process group)
        self.mailbox.pause_receiving(True)
        for name, ep in runtime.static_peers.items():
            self.mailbox.connect(name, ep)
        self._running = True
        self._loop = asyncio.get_running_loop()
        if runtime.directory and self.name != DIRECTORY:
            self.mailbox.connect(DIRECTORY, runtime.directory)
            directory = self._directory()
            await directory.register(self.name, self.endpoint, pid=os.getpid(), host=socket.gethostname(),
                                     ask_timeout=max(30.0, runtime.down_after))
            await directory.watch(self.name, ask_timeout=30.0)
            self.spawn(self._heartbeats(), name="heartbeats")
        try:
            if self._schedule is not None:  # on_start and what it spawns are tracked: task "start"
                await self._schedule.task(self.on_start(), "start", name=f"{self.name}:start")
            else:
                await self.on_start()
        finally:
            self.mailbox.pause_receiving(False)
        if heapwatch.wanted(self.name, self.role) and runtime.run_dir:
            self.spawn(heapwatch.watch(self.name, runtime.run_dir), name="heapwatch")
        self.log.info("actor started", endpoint=self.endpoint, pid=os.getpid(), console=False)
        return self.endpoint

    async def stop(self, reason: str = "stopped") -> None:
        """Stop: on_stop hook, deregister, cancel background tasks, close mailbox and trace."""
        if not self._running:
            return
        self._running = False
        if self._schedule is not None and _sched.current() is None:
            # stopped from outside its tasks (a signal, the process hosting it): the stop runs as the tracked task
            # "stop", so the schedule holds where it began and replay stops the actor at the same place
            caller = asyncio.current_task()  # (it awaits the stop: not one of the tasks the stop cancels)
            await self._schedule.task(self._shut_down(reason, caller), _sched.STOPPED, name=f"{self.name}:stop")
        else:
            await self._shut_down(reason)

    async def _shut_down(self, reason: str, caller: asyncio.Task | None = None) -> None:
        try:
            await self.on_stop()
        except Exception as exc:  # a hook failing must not keep the process alive
            self.log.error("on_stop failed", error=repr(exc))
        if self.runtime.directory and self.name != DIRECTORY:
            try:
                await self._directory().deregister(self.name, ask_timeout=2.0)
            except Exception:
                pass
        current = asyncio.current_task()
        pending = [t for t in self._tasks if t is not current and t is not caller]
        for t in pending:
            t.cancel()
        if pending:
            # let the cancelled handlers end before the mailbox closes: their askers get the error reply
            # ("stopped while handling ...") and the trace their outcome, whatever they were awaiting
            await asyncio.wait(pending, timeout=1.0)
        else:
            await asyncio.sleep(0)
        self.mailbox.close()
        if self.tracer is not None:
            self.tracer.close()
        self.log.info("actor stopped", reason=reason, console=False)
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    @property
    def running(self) -> bool:
        return self._running

    def spawn(self, coro, name: str | None = None) -> asyncio.Task:
        """Run a background coroutine owned by the actor; a crash in it is logged and reported to on_failure."""
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{name or 'task'}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.log.error("background task failed", task=task.get_name(), error=repr(exc))

    async def run_blocking(self, fn, *args, **kwargs):
        """Run CPU- or IO-heavy work in a thread so the loop keeps answering (heartbeats, pings)."""
        return await self.host.in_thread(lambda: fn(*args, **kwargs))

    # ------------------------------------------------------------------------------------------ sending
    # ask and tell hand back the mailbox's coroutine (await it) instead of wrapping it in one of their own: a
    # coroutine frame fewer on every call and every resumption
    def ask(self, to: str, method: str, body: Any = None, *, timeout: float | None = None,
            idem: str | None = None, host_copy: bool = False) -> Coroutine[Any, Any, Any]:
        """Send a request to `to` (a name, role/index) and wait for the reply: ``await actor.ask(...)``."""
        return self.mailbox.ask(to, method, body, timeout=timeout, idem=idem, host_copy=host_copy)

    def tell(self, to: str, method: str, body: Any = None, *, host_copy: bool = False) -> Coroutine[Any, Any, str]:
        """Send a one-way message: ``await actor.tell(...)``. Waits while the peer's queue is full; after the await
        the caller may change the arrays it sent (a writable one under 4 MiB is copied; the tell of a larger one
        returns once it has been written out: docs/wire-format.md, "Arrays are sent from your memory")."""
        return self.mailbox.tell(to, method, body, host_copy=host_copy)

    def record_input(self, name: str, value: Any, key: str | None = None) -> None:
        """Record a nondeterministic input (engine output, clock) in the trace for replay."""
        if self.tracer is not None:
            self.tracer.record_input(name, value, key)

    @property
    def replaying(self) -> bool:
        """True while `slime-actors replay` runs this actor against a recording (no engine, no network)."""
        return getattr(self.tracer, "replaying", False)

    def recorded(self, name: str, fn, *args, key: str | None = None) -> Any:
        """`fn(*args)`, recorded in the trace as a nondeterministic input (a clock reading, a random draw); under
        replay, the recorded value instead (fn is not called). Inside another recorded call (`recorded_async`) it is
        only called: the outer call's answer is what a replay serves (see IN_RECORDED_CALL)."""
        if IN_RECORDED_CALL.get():
            return fn(*args)
        if self.tracer is not None and self.replaying:
            return self.tracer.replay_input(name, key)
        value = fn(*args)
        self.record_input(name, value, key)
        return value

    def wall_time(self) -> float:
        """time.time() as a recorded input: a clock reading that decides something or goes into a message (replay
        serves it back)."""
        return self.recorded("clock", time.time)

    def monotonic(self) -> float:
        """time.monotonic() as a recorded input (a timeout measured by the actor; replay serves it back)."""
        return self.recorded("clock.monotonic", time.monotonic)

    async def recorded_async(self, name: str, fn, *args, key: str | None = None, **kwargs) -> Any:
        """`await fn(*args, **kwargs)` as a recorded input (an engine's answer); under replay the recorded answer,
        delivered at the time it was recorded (slime_actors/traces/replay.py). Inside another recorded call it is
        only awaited (see IN_RECORDED_CALL)."""
        if IN_RECORDED_CALL.get():
            return await fn(*args, **kwargs)
        if self.tracer is not None and self.replaying:
            return await self.tracer.replay_input_async(name, key)
        token = IN_RECORDED_CALL.set(True)
        try:
            value = await fn(*args, **kwargs)
        except Exception as exc:  # a failure is an input too: replay raises it again
            self.record_input(name, raised(exc), key)
            raise
        finally:
            IN_RECORDED_CALL.reset(token)
        self.record_input(name, value, key)
        return value

    async def recorded_many_async(self, name: str, fn, *args, keys: list[str]) -> list:
        """`await fn(*args)` -- one call answering a list, one answer per key (a batched engine request) -- recorded
        as one input per key, as `recorded_async` records each of many calls; under replay those recorded answers.
        The call suspends once, so a replay does too: the first answer is delivered at its recorded time, the rest
        with it. A call that raises is recorded as raised under every key."""
        if IN_RECORDED_CALL.get():
            return list(await fn(*args))
        if self.tracer is not None and self.replaying:
            if not keys:
                return []
            first = await self.tracer.replay_input_async(name, keys[0])
            return [first] + [self.tracer.replay_input(name, k) for k in keys[1:]]
        token = IN_RECORDED_CALL.set(True)
        try:
            values = list(await fn(*args))
            if len(values) != len(keys):
                raise RuntimeError(f"{name}: {len(values)} answers for {len(keys)} requests")
        except Exception as exc:  # a failure is an input too: replay raises it again
            for k in keys:
                self.record_input(name, raised(exc), k)
            raise
        finally:
            IN_RECORDED_CALL.reset(token)
        for k, v in zip(keys, values):
            self.record_input(name, v, k)
        return values

    def _directory(self) -> DirectoryHandle:
        """The directory, asked through this actor's mailbox itself (registration, lookups: the runtime's own
        messages, sent before the actor's handlers run and while a peer is being resolved)."""
        return DirectoryHandle(self.mailbox, DIRECTORY)

    async def _resolve(self, name: str) -> str:
        if name in self.runtime.static_peers:
            return self.runtime.static_peers[name]
        if not self.runtime.directory:
            raise UnknownPeer(f"{self.name}: no endpoint known for {name!r} and no directory configured")
        wait = max(10.0, self.runtime.down_after * 4)
        try:
            return await self._directory().lookup(name, wait=wait, ask_timeout=wait + 5)
        except MailboxError as exc:
            raise UnknownPeer(f"{self.name}: cannot find {name!r} in the directory: {exc}") from None

    async def _heartbeats(self) -> None:
        interval = self.runtime.heartbeat_interval
        body = {"pid": os.getpid()}
        while self._running:
            try:
                await self.mailbox.heartbeat(DIRECTORY, body)
            except MailboxError as exc:
                self.log.warning("heartbeat not sent", error=str(exc))
            await asyncio.sleep(interval)

    def on_heartbeat(self, header: dict, body: bytes = b"") -> None:
        """Heartbeats are for the directory; other actors ignore them."""

    def expect_silence(self, seconds: float, why: str) -> None:
        """Say before work that holds this process's interpreter for longer than the liveness allows (the torch
        profiler's stop and export, a CUDA memory snapshot: C++ calls that keep the GIL, so the heartbeat task cannot
        run): the directory does not declare this actor down for `seconds` (at most directory.QUIET_MAX_S), and 0
        ends the window. Sent as a heartbeat (not traced as a request; a replay, which has no directory, sends
        nothing). From a run_blocking thread it waits up to 5 s for the heartbeat to be sent; from the event loop it
        is sent soon after."""
        loop = self._loop
        if not self.runtime.directory or self.name == DIRECTORY or not self._running or loop is None:
            return
        body = {"pid": os.getpid(), "quiet_for": float(seconds), "why": why}
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            with _sched.untracked():   # the runtime's own message, not a task of the actor's schedule
                self.spawn(self.mailbox.heartbeat(DIRECTORY, body), name="quiet")
            return
        try:
            asyncio.run_coroutine_threadsafe(self.mailbox.heartbeat(DIRECTORY, body), loop).result(timeout=5)
        except Exception as exc:  # noqa: BLE001 -- the work goes on; the directory may then declare it down
            self.log.warning("quiet window not announced", seconds=seconds, why=why, error=repr(exc))

    # ------------------------------------------------------------------------------------------ built-ins
    @handler
    def _ping(self) -> dict:
        return {"name": self.name, "role": self.role, "index": self.index, "pid": os.getpid(),
                "host": socket.gethostname(), "uptime": time.time() - self.started_at}

    @handler
    def _stats(self) -> dict:
        out = dict(self.counters)
        out.update({f"mailbox_{k}": v for k, v in self.mailbox.stats.items()})
        out["busy"] = self._busy
        if self.tracer is not None:
            out["trace_records"] = self.tracer.records
        if self.mailbox.keys is not None:
            from ..mailbox.mailbox import context
            from ..mailbox.security import Authenticator
            auth = Authenticator._by_ctx.get(id(context()))
            if auth is not None:
                out["auth_accepted"], out["auth_refused"] = auth.accepted, auth.refused
        return out

    @handler
    def _stop(self, reason: str = "asked to stop") -> dict:
        self.spawn(self._stop_soon(reason), name="stop")
        return {"stopping": True}

    async def _stop_soon(self, reason: str) -> None:
        await asyncio.sleep(0.05)  # the reply goes out first
        await self.stop(reason)

    @handler
    async def _peer_down(self, name: str, reason: str = "missed heartbeats") -> None:
        self.mailbox.disconnect(name, reason)
        if reason == "stopped":   # it deregistered: a clean stop (every job's end), not a fault
            self.log.info("peer stopped", peer=name, console=False)
        else:
            self.log.warning("peer down", peer=name, reason=reason)
        await self.on_peer_down(name, reason)

    @handler
    async def _peer_up(self, name: str, endpoint: str) -> None:
        known = self.mailbox.peers().get(name)
        if known is not None and known != endpoint:
            self.mailbox.disconnect(name, "restarted at a new endpoint")
        await self.on_peer_up(name, endpoint)


def raised(exc: BaseException) -> dict:
    """How a call that raised is recorded as an input: the exception's class (module:QualName; replay raises one of
    it again), its message and its plain attributes (an EngineError's status)."""
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}:{cls.__qualname__}"
    attrs = {k: v for k, v in vars(exc).items() if isinstance(v, (str, int, float, bool, type(None)))} \
        if hasattr(exc, "__dict__") else {}
    out: dict[str, Any] = {"__raised__": name, "message": str(exc)[:2000]}
    if attrs:
        out["attrs"] = attrs
    return out


_sched.external(Actor.recorded_async)
_sched.external(Actor.recorded_many_async, "recorded_async")  # (replay's stand-in is replay_input_async)
_sched.external(Actor.run_blocking)

__all__ = ["Actor", "handler", "DIRECTORY", "PeerDown"]
