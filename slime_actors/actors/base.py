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
their parent, so a trace shows the causal chain.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any, ClassVar

from ..handles import Handle
from ..log import get_logger
from ..mailbox import codec
from ..mailbox.codec import ProtocolError
from ..mailbox.errors import MailboxError, PeerDown, UnknownPeer
from ..mailbox.mailbox import Inbound, Mailbox, current_cause, unpack_error
from ..mailbox.tracing import fast_entries
from ..messages import CATALOG, BadRequest, MessageSpec, check_handler, spec_from_signature
from ..runtime import RuntimeConfig
from ..traces.writer import TraceWriter, trace_file_name
from . import schedule as _sched
from .host import LOCAL, Host

DIRECTORY = "directory/0"
_time_ns = time.time_ns

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


class Actor:
    """Base class of every actor. Subclasses set `role` and declare handlers with @handler."""

    role: ClassVar[str] = "actor"
    _handlers: ClassVar[dict[str, _Handler]] = {}

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

    def __init__(self, index: int = 0, **config: Any):
        self.index = index
        self.name = f"{self.role}/{index}"
        self.config = config
        self.log = get_logger(actor=self.name)
        self.runtime: RuntimeConfig | None = None
        self.host: Host = LOCAL  # mailbox, recorder, clock, schedule, threads: Actor.start(host=...)
        self.mailbox: Mailbox | None = None
        self.tracer: TraceWriter | None = None
        self._schedule: _sched.Schedule | None = None  # the order its tasks run in, recorded with its trace
        self._clock_time = time.time  # the host's clock (deadlines)
        self.started_at = time.time()
        self.counters = {"handled": 0, "failed": 0, "bad_requests": 0, "unknown_method": 0, "expired": 0}
        self._busy = 0
        self._tasks: set[asyncio.Task] = set()
        self._stopped: asyncio.Event | None = None
        self._idem: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._idem_max = 4096
        self._running = False
        self._trace = None  # the trace writer's queue append, once started with tracing on
        self._tpack = None  # ... and its packer for records of bytes (the event loop thread's own)
        self._trec = None  # ... and its queue of packed records (TraceWriter.rec)
        self._tlimit = -1

    # ------------------------------------------------------------------------------------------ hooks
    async def on_start(self) -> None:
        """Called once the mailbox is bound and registered, before heartbeats report the actor alive."""

    async def on_stop(self) -> None:
        """Called when the actor stops, before its mailbox closes (peers can still be told things)."""

    async def on_failure(self, exc: BaseException, header: dict) -> None:
        """Called when a handler raises. The asker (if any) already got an error reply."""

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
            # what replay needs of the runtime to run the actor as it ran (its timers, its limits)
            meta = {**self.trace_meta(), "runtime": {
                "heartbeat_interval": runtime.heartbeat_interval, "liveness": runtime.liveness,
                "transport": runtime.transport, "max_concurrency": runtime.mailbox.max_concurrency,
                "default_timeout": runtime.mailbox.default_timeout}}
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
        replay, the recorded value instead (fn is not called)."""
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
        delivered at the time it was recorded (slime_actors/traces/replay.py)."""
        if self.tracer is not None and self.replaying:
            return await self.tracer.replay_input_async(name, key)
        try:
            value = await fn(*args, **kwargs)
        except Exception as exc:  # a failure is an input too: replay raises it again
            self.record_input(name, raised(exc), key)
            raise
        self.record_input(name, value, key)
        return value

    def _directory(self) -> Handle:
        """The directory, asked through this actor's mailbox itself (registration, lookups: the runtime's own
        messages, sent before the actor's handlers run and while a peer is being resolved)."""
        return Handle(self.mailbox, DIRECTORY)

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

    # ------------------------------------------------------------------------------------------ receiving
    def _on_drop(self, reason: str, identity) -> None:
        n = self.mailbox.stats["dropped"] if self.mailbox else 0
        if n <= 10 or n % 1000 == 0:
            self.log.warning("message dropped", reason=reason, dropped_total=n)

    def _on_request(self, inbound: Inbound) -> None:
        h = inbound.header
        kind = h["kind"]
        if kind == "hb":
            if inbound.t_ns:
                self._trace_recv(inbound)
            self.on_heartbeat(h)
            return
        method = h["method"]
        hd = self._handlers.get(method)
        is_ask = kind == "ask"
        if hd is None:
            self.counters["unknown_method"] += 1
            msg = (f"unknown method {method!r} on {self.name} (role {self.role}); it handles: "
                   f"{', '.join(sorted(m for m in self._handlers if not m.startswith('_')))}")
            self._reject(inbound, "UnknownMethod", msg, is_ask)
            return
        dl = h.get("deadline")
        if dl is not None and dl < self._clock_time():
            self.counters["expired"] += 1
            self._reject(inbound, "DeadlineExceeded", f"{self.name}.{method}: deadline passed before handling",
                         is_ask)
            return
        try:
            kwargs = hd.spec.check(codec.decode_body(inbound.body_bytes, inbound.arrays))
        except (ProtocolError, BadRequest) as exc:
            self.counters["bad_requests"] += 1
            self._reject(inbound, type(exc).__name__, str(exc), is_ask)
            return
        idem = h.get("idem")
        if idem is not None and is_ask:
            key = (h["from"], idem)
            cached = self._idem.get(key)
            if cached is not None:
                if inbound.t_ns:
                    self._trace_recv(inbound)
                self.spawn(self._answer_duplicate(inbound, cached), name="duplicate")
                return
            self._idem[key] = asyncio.get_running_loop().create_future()
            if len(self._idem) > self._idem_max:
                self._idem.popitem(last=False)
        token = current_cause.set((h["trace"], h["id"]))
        try:
            if hd.is_async:
                if inbound.t_ns:
                    self._trace_recv(inbound)
                self._busy += 1
                if self._busy >= self.runtime.mailbox.max_concurrency:
                    self.mailbox.pause_receiving(True)
                coro, sched = self._run_async(hd, inbound, kwargs), self._schedule
                task = (asyncio.get_running_loop().create_task(coro) if sched is None else
                        sched.task(coro, sched.dispatch_child(h["id"])))  # the request's task: "m:<id>"
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                # for the trace: from when the request counts as begun, its arrival where the mailbox stamped it (a
                # sync handler's time then includes decoding and checking its body, and the trace needs no clock
                # read of its own for the start); untraced, no clock is read at all
                t0 = inbound.t_ns or (_time_ns() if self.tracer is not None else 0)
                try:
                    result = hd.fn(self, **kwargs)
                except Exception as exc:
                    self._failed(inbound, exc, t0)
                else:
                    self._succeeded(inbound, result, t0)
        finally:
            current_cause.reset(token)

    async def _run_async(self, hd: _Handler, inbound: Inbound, kwargs: dict) -> None:
        t0 = _time_ns() if self.tracer is not None else 0
        try:
            result = await hd.fn(self, **kwargs)
        except asyncio.CancelledError:
            self._failed(inbound, MailboxError(f"{self.name} stopped while handling {inbound.header['method']}"),
                         t0)
            raise
        except Exception as exc:
            self._failed(inbound, exc, t0)
        else:
            self._succeeded(inbound, result, t0)
        finally:
            self._busy -= 1
            if self._busy < self.runtime.mailbox.max_concurrency and self.mailbox is not None:
                self.mailbox.pause_receiving(False)

    def _succeeded(self, inbound: Inbound, result: Any, t0: int) -> None:
        """A handler returned; `t0` is when its request counts as begun (time_ns: see _on_request), 0 untraced.

        Its trace is written after the reply (the asker need not wait for it); in the common case one record of
        arrival and outcome, [..., extra, dur_ns], handled at arrival + dur_ns. An ask's handling ends before its
        reply is built; a tell's when its record is packed, which reads the clock itself (dur None)."""
        h = inbound.header
        done = None
        if h["kind"] == "ask":
            if t0:
                done = _time_ns()
            if h.get("idem") is not None:
                self._remember(h, ("reply", result))
            self._send_reply(inbound, result, None)
        self.counters["handled"] += 1
        if t0:
            body = inbound.body_bytes
            if t0 == inbound.t_ns and not inbound.arrays and len(body) <= self._tlimit:
                inbound.t_ns = 0
                # a wall-clock step back reads as 0, not as a negative time
                self._trec("recv", t0, inbound.header_bytes, body,
                           None if done is None else done - t0 if done > t0 else 0)
            else:
                if done is None:
                    done = _time_ns()
                self._trace_handled(inbound, {"outcome": "ok", "dur_ns": done - t0 if done > t0 else 0}, done)

    def _failed(self, inbound: Inbound, exc: BaseException, t0: int) -> None:
        self.counters["failed"] += 1
        h = inbound.header
        err = unpack_error(exc, self.name, h["method"])
        if self.tracer is not None:
            done = _time_ns()
            self._trace_handled(inbound, {"outcome": "error", "error": f"{err['type']}: {err['message']}"[:2000],
                                          "dur_ns": done - t0 if done > t0 else 0}, done)
        self.log.error("handler failed", method=h["method"], sender=h["from"], error=f"{err['type']}: {exc}")
        if h["kind"] == "ask":
            self._remember(h, ("error", err))
            self._send_reply(inbound, None, err)
        if type(self).on_failure is not Actor.on_failure:
            self.spawn(self.on_failure(exc, h), name="on_failure")

    def _trace_recv(self, inbound: Inbound, extra: dict | None = None) -> None:
        """Write the recv record the mailbox left to us (Inbound.t_ns), once."""
        t, inbound.t_ns = inbound.t_ns, 0
        body, arrays = inbound.body_bytes, inbound.arrays
        if not arrays and len(body) <= self._tlimit:
            self._trace(self._tpack(("recv", t, inbound.header_bytes, body, len(body), None, None, extra)))
        else:
            refs, bufs = self.mailbox.recv_arrays(inbound.header, arrays, inbound.kept)
            self._trace(("recv", t, inbound.header_bytes, body, refs, bufs, extra))

    def _trace_handled(self, inbound: Inbound, extra: dict, t: int) -> None:
        """Record a request's outcome: merged into its recv record when that is not written yet (one record)."""
        if inbound.t_ns:
            extra["t"] = t
            self._trace_recv(inbound, {"handled": extra})
        elif self._trace is not None:
            self._trace(self._tpack(("handled", t, inbound.header_bytes, None, 0, None, None, extra)))
        else:
            self.tracer.record("handled", inbound.header_bytes, None, extra=extra)

    def _remember(self, h: dict, outcome) -> None:
        idem = h.get("idem")
        if idem is None:
            return
        fut = self._idem.get((h["from"], idem))
        if fut is not None and not fut.done():
            fut.set_result(outcome)
        self._idem[(h["from"], idem)] = outcome

    async def _answer_duplicate(self, inbound: Inbound, cached) -> None:
        if isinstance(cached, asyncio.Future):
            cached = await cached
        kind, value = cached
        if self.tracer is not None:  # answered without running the handler: traced as handled from the cache
            self._trace_handled(inbound, {"outcome": "cached", "cached": kind, "dur_ns": 0}, _time_ns())
        await self.mailbox.reply(inbound, value if kind == "reply" else None,
                                 error=value if kind == "error" else None)

    def _send_reply(self, inbound: Inbound, result: Any, error: dict | None) -> None:
        try:
            later = self._reply_nowait(inbound, result, error=error)
        except Exception as exc:
            self.log.error("reply failed", method=inbound.header["method"], error=repr(exc))
            return
        if later is not None:  # the asker's queue is full: finish in the background (the mailbox's, not tracked)
            with _sched.untracked():
                self.spawn(later, name="reply")

    def _reject(self, inbound: Inbound, typ: str, message: str, is_ask: bool) -> None:
        h = inbound.header
        if self.tracer is not None:
            self._trace_handled(inbound, {"outcome": "rejected", "error": f"{typ}: {message}"[:2000], "dur_ns": 0},
                                _time_ns())
        self.log.warning("request rejected", method=h.get("method"), sender=h.get("from"), error=message)
        if is_ask:
            self._send_reply(inbound, None, {"type": typ, "message": message, "peer": self.name,
                                             "method": h.get("method", "")})

    def on_heartbeat(self, header: dict) -> None:
        """Heartbeats are for the directory; other actors ignore them."""

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
    out = {"__raised__": name, "message": str(exc)[:2000]}
    if attrs:
        out["attrs"] = attrs
    return out


_sched.external(Actor.recorded_async)
_sched.external(Actor.run_blocking)
_sched.dispatcher(Actor._on_request)

__all__ = ["Actor", "handler", "DIRECTORY", "PeerDown"]
