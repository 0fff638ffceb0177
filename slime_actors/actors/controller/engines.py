"""The controller's view of the rollout workers and their engines: the weight version each engine holds, starting
(resume), pausing and ending rollouts, and the weight sync from the trainer ranks.

An engine that (re)starts reports `engine_ready` at the version it holds (its launch weights: an old one); it is
brought to the current weights before it serves again: at the start of the job (`sync_at_start`), after a restart of
the training group (the same), or at once while the job runs (`ready` re-syncs it in the background and lets it work
if a rollout is running). A (re)started engine was in no broadcast group yet: trainer rank 0 builds a new one.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from ...handles import GroupFailed
from ...messages import WeightsSynced
from ...role_handles import RolloutGroup, RolloutHandle

if TYPE_CHECKING:
    from .actor import Controller


class Engines:
    def __init__(self, ctl: Controller):
        self.ctl = ctl
        self.names = [f"rollout/{i}" for i in range(ctl.cfg.engine.n_engines)]
        self.workers = RolloutGroup(RolloutHandle(ctl, name) for name in self.names)
        self.versions: dict[str, int] = {}     # the weight version each engine holds (-1: to be synced)
        self._fresh: set[str] = set()           # engines (re)started since their last weight sync
        self._lock = asyncio.Lock()             # one weight sync at a time
        self._resyncs: dict[str, asyncio.Task] = {}

    # ------------------------------------------------------------------------------------------ rollouts
    async def resume(self) -> None:
        """Every engine at the current weights starts (or goes on) pulling work from the buffer."""
        for worker in self.workers.members:
            if self.versions.get(worker.name) == self.ctl.version:
                await worker.tell.resume(weight_version=self.ctl.version)

    async def take_ahead(self, k: int) -> None:
        """Rollout k was made ahead (held): each engine serving now takes some of its groups, to start them when it
        is resumed at their weights (a (re)started one pulls them once the rollout opens)."""
        for worker in self.workers.members:
            if self.versions.get(worker.name) == self.ctl.version:   # (the engines the weight sync goes to)
                await worker.tell.take_ahead(k)

    async def pause(self) -> None:
        await self.workers.quietly.pause(ask_timeout=60)

    @asynccontextmanager
    async def paused(self, busy: bool = True):
        """`async with engines.paused(busy)`: paused for the block and resumed after it, when `busy` (generating)."""
        if busy:
            await self.pause()
        yield
        if busy:
            await self.resume()

    async def end_rollout(self, k: int) -> None:
        """Rollout k is complete: each worker aborts what it still generates and hands it back to the buffer."""
        await self.workers.quietly.end_rollout(k, ask_timeout=120)

    # ------------------------------------------------------------------------------------------ weights
    async def sync_at_start(self) -> None:
        """Wait for every engine, and bring them to the current weights (a resumed run starts at version > 0)."""
        ctl, t0 = self.ctl, None
        while len(self.versions) < len(self.names):
            if t0 is None:  # (recorded clock readings: a replay takes the same turns)
                t0 = ctl.monotonic()
            elif ctl.monotonic() - t0 > 900:
                raise TimeoutError("engines did not report ready within 900 s: "
                                   f"{sorted(set(self.names) - set(self.versions))}")
            await asyncio.sleep(0.05)
        ctl.phase = "sync"
        behind = [w for w in self.names if self.versions.get(w) != ctl.version]
        if behind:
            async with self._lock:
                await self._push(ctl.version, behind)
                for w in behind:
                    self.versions[w] = ctl.version
        ctl.phase = "idle"

    async def sync(self, version: int) -> WeightsSynced:
        """Weights `version` to every engine (paused for it in --async-train, where they generate meanwhile); what
        trainer rank 0 reports of the transfer."""
        async with self._lock:
            ready = [w for w in self.names if w in self.versions]
            if self.ctl.cfg.run.async_train:
                await self.pause()
            for attempt in range(3):
                try:
                    info = await self._push(version, ready)
                    break
                except GroupFailed as exc:
                    # an engine that died mid-sync breaks the broadcast; its worker restarts it and the retry
                    # builds a new group (a dead trainer rank is confirmed instead, and handled by the recovery)
                    if exc.confirmed or attempt == 2:
                        raise
                    self.ctl.log.warning("weight sync failed; retrying with a new group", error=str(exc))
                    self._fresh |= set(ready)
                    await asyncio.sleep(1.0)
            for w in ready:
                self.versions[w] = version
            if self.ctl.cfg.run.async_train:
                await self.resume()
            return info

    async def _push(self, version: int, workers: list[str]) -> WeightsSynced:
        """Every trainer rank takes part (gathering weights is a collective under FSDP/Megatron); rank 0 sends."""
        rebuild = bool(self._fresh & set(workers))
        replies = await self.ctl.trainers.sync_weights(version, workers, rebuild=rebuild, ask_timeout=1800)
        self._fresh -= set(workers)
        return replies[0]

    def forget_versions(self) -> None:
        """The training group restarted from a checkpoint: every engine gets its weights before it serves again."""
        for w in list(self.versions):
            self.versions[w] = -1

    # ------------------------------------------------------------------------------------------ (re)started engines
    def ready(self, worker: str, weight_version: int) -> None:
        """An engine (re)started at `weight_version`: bring it to the current weights, then let it work."""
        self.versions[worker] = weight_version
        self._fresh.add(worker)
        if self.ctl.phase in ("starting", "recovering"):
            return  # the start-up sync (or the one after a trainer-group restart) covers it
        prev = self._resyncs.get(worker)
        if prev is not None and not prev.done():
            prev.cancel()
        self._resyncs[worker] = self.ctl.spawn(self._resync(worker), name=f"resync:{worker}")

    async def _resync(self, worker: str) -> None:
        ctl = self.ctl
        for attempt in range(3):
            try:
                async with self._lock:
                    if self.versions.get(worker) != ctl.version:
                        ctl.log.info("re-syncing a restarted engine", worker=worker, to_version=ctl.version)
                        await self._push(ctl.version, [worker])
                        self.versions[worker] = ctl.version
                break
            except GroupFailed as exc:
                if exc.confirmed:
                    ctl.group.failed(str(exc))
                    return
                ctl.log.warning("re-sync failed; retrying", worker=worker, error=str(exc), attempt=attempt)
                self._fresh.add(worker)
                await asyncio.sleep(1.0 + attempt)
        else:
            ctl.log.error("could not re-sync a restarted engine; stopping the job", worker=worker)
            ctl.stop_job(RuntimeError(f"could not re-sync the restarted engine of {worker}"))
            return
        if ctl.phase in ("rollout", "eval"):
            await RolloutHandle(ctl, worker).tell.resume(weight_version=ctl.version)
