"""How an actor takes a message: the receiving half of `Actor` (actors/base.py), a mixin of it.

A request is looked up among the actor's declared handlers, its deadline and body are checked against the catalog
(slime_actors/messages.py), a repeated idempotency key is answered from the cache, then the handler runs -- inline
when it is a plain function, as a task (one of the actor's tracked tasks, named after the request) when it is a
coroutine -- and its reply or error goes back to the asker. Each request's arrival and outcome is one trace record
in the common case (docs/trace-format.md).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from ..mailbox import codec
from ..mailbox.codec import ProtocolError
from ..mailbox.errors import MailboxError
from ..mailbox.mailbox import Inbound, Mailbox, current_cause, unpack_error
from ..messages import BadRequest
from . import schedule as _sched

if TYPE_CHECKING:
    from ..runtime import RuntimeConfig

_time_ns = time.time_ns


class Dispatch:
    """The receiving half of Actor: `_on_request` is the mailbox's callback for every request and heartbeat."""

    # what it uses of the actor (actors/base.py sets them up; the mailbox and the runtime in Actor.start)
    name: str
    role: ClassVar[str]
    log: Any
    mailbox: Mailbox
    runtime: RuntimeConfig
    tracer: Any
    counters: dict[str, int]
    _handlers: ClassVar[dict[str, Any]]
    _clock_time: Callable[[], float]
    _idem: OrderedDict[tuple[str, str], Any]
    _idem_max: int
    _busy: int
    _schedule: _sched.Schedule | None
    _tasks: set[asyncio.Task]
    _tlimit: int
    _trace: Any
    _tpack: Any
    _trec: Any
    _reply_nowait: Callable[..., Any]
    spawn: Callable[..., asyncio.Task]
    on_heartbeat: Callable[[dict, bytes], None]

    async def on_failure(self, exc: BaseException, header: dict) -> None:
        """Called when a handler raises. The asker (if any) already got an error reply."""

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
            self.on_heartbeat(h, inbound.body_bytes)
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

    async def _run_async(self, hd: Any, inbound: Inbound, kwargs: dict) -> None:
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
        if type(self).on_failure is not Dispatch.on_failure:
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



_sched.dispatcher(Dispatch._on_request)
