"""An actor takes what it needs from its process -- its mailbox, its trace recorder, its clock, its schedule, thread
work -- from the Host it is started with (slime_actors/actors/host.py). `slime-actors replay` hands it stand-ins
that way (no module is patched); so can a test."""

import pytest

from helpers import LoopThread
from slime_actors.actors.base import Actor, handler
from slime_actors.actors.directory import Directory
from slime_actors.actors.host import LOCAL, Clock, Host
from slime_actors.mailbox.errors import RemoteError
from slime_actors.runtime import RuntimeConfig


class AheadClock(Clock):
    """A wall clock an hour ahead: every deadline a peer sets has passed by it."""

    @staticmethod
    def time():
        import time
        return time.time() + 3600.0


class WatchedHost(Host):
    """The real host, noting what the actor took from it."""

    def __init__(self, clock: Clock | None = None):
        self.clock = clock or Clock()
        self.mailboxes, self.tracers, self.schedules, self.threads = [], [], [], 0

    def mailbox(self, name, **kw):
        self.mailboxes.append(name)
        return super().mailbox(name, **kw)

    def tracer(self, path, actor, **kw):
        self.tracers.append(actor)
        return super().tracer(path, actor, **kw)

    def schedule(self, actor):
        sched = super().schedule(actor)
        self.schedules.append(sched)
        return sched

    async def in_thread(self, fn):
        self.threads += 1
        return await super().in_thread(fn)


class Worker(Actor):
    role = "hostcheck"

    @handler
    async def add_one(self, n: int) -> int:
        return await self.run_blocking(lambda: n + 1)


class Client(Actor):
    role = "hostclient"


@pytest.fixture
def lt():
    t = LoopThread()
    yield t
    t.close()


def test_an_actor_takes_its_mailbox_recorder_schedule_and_threads_from_its_host(lt, tmp_path):
    base = dict(run_dir=str(tmp_path), curve=False, heartbeat_interval=0.5, liveness=30)
    directory = Directory(0)
    rt = RuntimeConfig(directory=lt.call(directory.start(RuntimeConfig(**base))), **base)
    host = WatchedHost()
    worker, client = Worker(0), Client(0)
    lt.call(worker.start(rt, host=host))
    lt.call(client.start(rt))
    try:
        assert lt.call(client.ask("hostcheck/0", "add_one", {"n": 41}, timeout=20)) == 42
        assert host.mailboxes == ["hostcheck/0"] and host.tracers == ["hostcheck/0"] and host.threads == 1
        assert host.schedules == [worker._schedule] and worker._schedule is not None  # traced: its schedule kept
        assert worker.host is host and client.host is LOCAL  # (the default: the real process)
    finally:
        for a in (client, worker, directory):
            lt.call(a.stop())


def test_the_hosts_clock_decides_whether_a_deadline_has_passed(lt, tmp_path):
    """Deadlines are read on the host's clock (replay's is the recording's time): an hour ahead, every ask has
    expired on arrival and is refused as such, without running the handler."""
    base = dict(run_dir=str(tmp_path), curve=False, heartbeat_interval=0.5, liveness=30)
    directory = Directory(0)
    rt = RuntimeConfig(directory=lt.call(directory.start(RuntimeConfig(**base))), **base)
    host = WatchedHost(AheadClock())
    worker, client = Worker(0), Client(0)
    lt.call(worker.start(rt, host=host))
    lt.call(client.start(rt))
    try:
        with pytest.raises(RemoteError) as err:
            lt.call(client.ask("hostcheck/0", "add_one", {"n": 1}, timeout=20))
        assert err.value.type == "DeadlineExceeded" and "deadline passed before handling" in str(err.value)
        assert host.threads == 0 and worker.counters["expired"] == 1
    finally:
        for a in (client, worker, directory):
            lt.call(a.stop())
