"""The directory: which actor lives at which endpoint, and which actors are alive.

Every process registers its actor here at start-up (`register`), then sends a heartbeat every interval. An actor
whose heartbeats stop for `liveness × interval` seconds is declared down, and every watcher gets `_peer_down`; when
it registers again (a restart), watchers get `_peer_up` with its new endpoint. Lookups of a name that has not
registered yet wait for it (up to the asker's `wait`), so processes may start in any order. An actor about to
block its own process for longer than that (the torch profiler's export, a CUDA memory snapshot) first sends a
heartbeat that asks for a quiet window (Actor.expect_silence; at most QUIET_MAX_S), in which it is not declared down.

The launcher (or rank 0 under torchrun, or the first node under Slurm) hosts it as `directory/0`. Its clock readings
are recorded inputs (Actor.monotonic, Actor.wall_time), so a replay of it sees the liveness the run saw.
"""

from __future__ import annotations

import asyncio
import time

from ..mailbox import codec
from .base import Actor, handler

QUIET_MAX_S = 900.0   # the longest window an actor may be silent in by asking (a CUDA memory snapshot of a big job)


class Directory(Actor):
    role = "directory"

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.entries: dict[str, dict] = {}
        self.watchers: set[str] = set()
        self._registered: dict[str, asyncio.Event] = {}
        self.events: list[tuple[float, str, str]] = []  # (time, name, "up"/"down"/"left"), for the supervisor

    async def on_start(self) -> None:
        self.spawn(self._check_liveness(), name="liveness")

    # ------------------------------------------------------------------------------------------ handlers
    @handler
    async def register(self, name: str, endpoint: str, pid: int = 0, host: str = "", meta: dict | None = None):
        old = self.entries.get(name)
        now = self.monotonic()
        self.entries[name] = {"endpoint": endpoint, "pid": pid, "host": host, "meta": meta or {}, "alive": True,
                              "last_seen": now, "registered": self.wall_time(),
                              "incarnation": (old["incarnation"] + 1) if old else 0}
        self.mailbox.connect(name, endpoint)
        self._event(name).set()
        self.events.append((self.wall_time(), name, "up"))
        self.log.info("registered", name=name, endpoint=endpoint, pid=pid, restart=old is not None,
                      console=old is not None)   # a restart is news; a first registration is book-keeping
        if old is not None:
            await self._notify("_peer_up", {"name": name, "endpoint": endpoint}, skip=name)
        return {"ok": True, "heartbeat_interval": self.runtime.heartbeat_interval, "liveness": self.runtime.liveness}

    @handler
    async def deregister(self, name: str) -> None:
        entry = self.entries.pop(name, None)
        self.watchers.discard(name)
        self._registered.pop(name, None)
        if entry is not None:
            self.events.append((self.wall_time(), name, "left"))
            self.mailbox.disconnect(name, "stopped")
            await self._notify("_peer_down", {"name": name, "reason": "stopped"}, skip=name)

    @handler
    async def lookup(self, name: str, wait: float = 0.0) -> str:
        entry = self.entries.get(name)
        if entry is None and wait > 0:
            try:
                await asyncio.wait_for(self._event(name).wait(), wait)
            except asyncio.TimeoutError:
                pass
            entry = self.entries.get(name)
        if entry is None:
            known = ", ".join(sorted(self.entries)) or "none"
            raise LookupError(f"no actor named {name!r} is registered (registered: {known})")
        return entry["endpoint"]

    @handler
    def list(self) -> dict:
        return self._listing(self.monotonic())

    def snapshot(self) -> dict:
        """What `list` answers, for the process hosting the directory (its supervisor loop): read off the actor's
        messages, so it takes no recorded clock reading (a replay of the directory could not give it one)."""
        return self._listing(time.monotonic())

    def _listing(self, now: float) -> dict:
        return {n: {"endpoint": e["endpoint"], "pid": e["pid"], "host": e["host"], "alive": e["alive"],
                    "last_seen": round(now - e["last_seen"], 3), "incarnation": e["incarnation"]}
                for n, e in self.entries.items()}

    @handler
    def watch(self, name: str) -> None:
        self.watchers.add(name)

    def on_heartbeat(self, header: dict, body: bytes = b"") -> None:
        entry = self.entries.get(header["from"])
        if entry is None:
            return
        entry["last_seen"] = now = self.monotonic()
        if b"quiet_for" in body:   # Actor.expect_silence: a window in which it may miss heartbeats
            self._quiet(header["from"], entry, body, now)
        if not entry["alive"]:
            entry["alive"] = True
            self.events.append((self.wall_time(), header["from"], "up"))
            self.log.info("peer back", name=header["from"])
            self.spawn(self._notify("_peer_up", {"name": header["from"], "endpoint": entry["endpoint"]},
                                    skip=header["from"]), name="notify")

    def _quiet(self, name: str, entry: dict, body: bytes, now: float) -> None:
        """`name` is about to run work that holds its interpreter (the torch profiler's export, a CUDA memory
        snapshot), so its heartbeat task cannot run: it is not declared down for `quiet_for` seconds (at most
        QUIET_MAX_S; 0 ends the window). Past the window the usual liveness applies again."""
        try:
            ask = codec.decode_body(body, [])
            granted = min(max(0.0, float(ask["quiet_for"])), QUIET_MAX_S)
        except Exception as exc:  # noqa: BLE001 -- a malformed heartbeat is reported, not obeyed
            self.log.warning("malformed quiet window ignored", name=name, error=repr(exc))
            return
        entry["quiet_until"] = now + granted
        if granted:
            self.log.info("peer quiet", name=name, seconds=granted, why=str(ask.get("why", ""))[:200], console=False)

    async def _resolve(self, name: str) -> str:
        entry = self.entries.get(name)
        if entry is None:
            raise LookupError(f"no actor named {name!r} is registered")
        return entry["endpoint"]

    # ------------------------------------------------------------------------------------------ liveness
    def _event(self, name: str) -> asyncio.Event:
        ev = self._registered.get(name)
        if ev is None:
            ev = self._registered[name] = asyncio.Event()
        return ev

    async def _check_liveness(self) -> None:
        interval = self.runtime.heartbeat_interval
        limit = self.runtime.down_after
        while True:
            await asyncio.sleep(interval / 2)
            now = self.monotonic()
            for name, e in list(self.entries.items()):
                if e["alive"] and now - e["last_seen"] > limit and now >= e.get("quiet_until", 0.0):
                    e["alive"] = False
                    self.events.append((self.wall_time(), name, "down"))
                    self.log.warning("peer down", name=name, silent_for=round(now - e["last_seen"], 2))
                    self.mailbox.disconnect(name, "missed heartbeats")
                    await self._notify("_peer_down", {"name": name, "reason": "missed heartbeats"}, skip=name)

    async def _notify(self, method: str, body: dict, skip: str) -> None:
        for w in list(self.watchers):
            if w == skip or not self.entries.get(w, {}).get("alive"):
                continue
            try:
                await self.tell(w, method, body)
            except Exception as exc:
                self.log.warning("notice not delivered", to=w, method=method, error=repr(exc))
