"""What an actor takes from the process it runs in: its mailbox, its trace recorder, its clock, its schedule, thread
work, and (a trainer) its weight sender. `Actor.start(runtime, host=...)` is handed one; the default, `LOCAL`, is
the real thing. `slime-actors replay` hands a host of stand-ins instead (slime_actors/traces/replay.py): a mailbox
that talks to nobody, a recorder that serves recorded inputs, a virtual clock, the recorded schedule.
"""

from __future__ import annotations

import asyncio
import time as _time
from typing import Any, Callable

from ..mailbox.mailbox import Mailbox
from ..traces.writer import TraceWriter
from . import schedule as _schedule


class Clock:
    """Wall-clock time for stamps and deadlines (time.time / time.time_ns; replay: the recording's time)."""

    time = staticmethod(_time.time)
    time_ns = staticmethod(_time.time_ns)


class Host:
    """The real process: ZeroMQ mailbox, trace file, wall clock, schedule recorded into the trace, a thread pool."""

    clock: Clock = Clock()
    weight_sender: Callable[..., Any] | None = None  # None: backends.weight_sync.DistributedWeightSender

    def mailbox(self, name: str, **kw) -> Mailbox:
        return Mailbox(name, **kw)

    def tracer(self, path: str, actor: str, *, meta: dict, body_limit: int, keep_arrays: bool, max_bytes: int = 0):
        return TraceWriter(path, actor, meta=meta, body_limit=body_limit, keep_arrays=keep_arrays,
                           max_bytes=max_bytes)

    def schedule(self, actor) -> _schedule.Schedule | None:
        """Record the actor's schedule into its trace (when its tracer has the hot-path entries)."""
        rec = getattr(actor.tracer, "rec", None)
        if rec is None:
            return None
        loop = asyncio.get_running_loop()
        _schedule.install(loop)
        return _schedule.Schedule(rec, loop)

    async def in_thread(self, fn: Callable[[], Any]) -> Any:
        """Run `fn()` in the loop's thread pool (Actor.run_blocking)."""
        return await asyncio.get_running_loop().run_in_executor(None, fn)


LOCAL = Host()
