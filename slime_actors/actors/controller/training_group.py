"""The trainer ranks' group: its rendezvous, its failures, and its restart from the last checkpoint
(docs/fault-tolerance.md).

The trainer ranks form their process group through the controller (`trainer_join`: a rendezvous with a generation
number and the checkpoint to load; `trainer_ready` once loaded). When a rank dies -- an ask to it fails, the
directory declares it down, or it joins again after a restart -- the group of that generation is broken:
`supervise` stops the schedule, tells the members to leave (`abort_group`: they exit with code 75 and their
supervisor restarts them), ends the rollout in flight, rolls the buffer back to the last checkpoint (rollouts trained
after it are trained again, once, by the restored weights; its accounting reports what was discarded), waits for the
next generation to load that checkpoint, re-syncs every engine to its weights and runs the schedule again from the
checkpoint's rollout. More than MAX_GROUP_RESTARTS restarts within 600 s end the job.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ...handles import GroupFailed, outcome_seen

if TYPE_CHECKING:
    from .actor import Controller

MAX_GROUP_RESTARTS = 5  # training group restarts within 600 s before the job gives up


class Rendezvous:
    """One generation of the training group: who joined (rank -> address, port, pid), when it formed, who is ready."""

    def __init__(self, generation: int, world: int):
        self.generation, self.world = generation, world
        self.joined: dict[int, dict] = {}
        self.formed: asyncio.Future[dict] = asyncio.get_running_loop().create_future()
        self.ready: set[int] = set()
        self.all_ready = asyncio.Event()
        self.broken = False


class TrainingGroup:
    def __init__(self, ctl: Controller):
        self.ctl = ctl
        self.world = len(ctl.trainers)
        self.rdzv: Rendezvous | None = None
        self.recoveries: list[dict] = []
        self._fail: asyncio.Future[str] | None = None  # set (to the reason) when the current generation failed
        self._failed_generation: int | None = None

    @property
    def current(self) -> Rendezvous:
        """The current generation (`start` opens generation 0)."""
        if self.rdzv is None:
            raise RuntimeError("the training group is not started")
        return self.rdzv

    @property
    def failing(self) -> asyncio.Future[str]:
        """Set to the reason when the current generation fails (a new one after each restart)."""
        if self._fail is None:
            raise RuntimeError("the training group is not started")
        return self._fail

    def start(self) -> None:
        """Open generation 0 (in the event loop)."""
        self.rdzv = Rendezvous(0, self.world)
        self._fail = asyncio.get_running_loop().create_future()

    # ------------------------------------------------------------------------------------------ rendezvous
    async def join(self, rank: int, world_size: int, addr: str, port: int, pid: int) -> dict:
        """A rank joins; answered when every rank of this generation has joined."""
        if world_size != self.world or not 0 <= rank < world_size:
            raise ValueError(f"trainer rank {rank} of world size {world_size} does not fit this job's "
                             f"{self.world} trainer rank(s)")
        rd = self.current
        if rd.formed.done():  # a member joins again: it restarted, so the group it was part of is broken
            self.failed(f"trainer/{rank} restarted (pid {pid}) and joined again")
            rd = self.next_generation()
        rd.joined[rank] = {"addr": addr, "port": port, "pid": pid}
        self.ctl.log.info("trainer joined", rank=rank, generation=rd.generation, joined=len(rd.joined), of=rd.world)
        if len(rd.joined) == rd.world and not rd.formed.done():
            if 0 not in rd.joined or not rd.joined[0]["port"]:
                raise ValueError("trainer rank 0 did not offer a port for the group's store")
            m, ckpt = rd.joined[0], self.ctl.checkpoints.latest
            rd.formed.set_result({"master_addr": m["addr"], "master_port": m["port"], "generation": rd.generation,
                                  "checkpoint": str(ckpt) if ckpt else None})
        return await asyncio.shield(rd.formed)

    def ready_rank(self, rank: int, generation: int) -> None:
        rd = self.current
        if generation != rd.generation:
            return
        rd.ready.add(rank)
        if len(rd.ready) == rd.world:
            rd.all_ready.set()

    async def ready(self, timeout: float = 1800.0) -> None:
        """Wait until every rank of the current generation has its process group and its checkpoint."""
        rd = self.current
        try:
            await asyncio.wait_for(rd.all_ready.wait(), timeout)
        except asyncio.TimeoutError:
            missing = sorted(set(range(rd.world)) - rd.ready)
            raise TimeoutError(f"trainer ranks {missing} did not join and load within {timeout:.0f}s "
                               f"(generation {rd.generation})") from None

    def next_generation(self) -> Rendezvous:
        rd = self.current
        if not rd.formed.done():
            return rd
        rd.broken = True
        self.rdzv = Rendezvous(rd.generation + 1, self.world)
        return self.rdzv

    @property
    def failure(self) -> str | None:
        """Why the current generation failed (None: it has not)."""
        return self._fail.result() if self._fail is not None and self._fail.done() else None

    def failed(self, reason: str) -> None:
        """The current generation is broken (a rank died, or restarted): `supervise` restarts the group."""
        rd = self.current
        if rd.broken or not rd.formed.done():
            return
        self.ctl.log.error("training group failed", generation=rd.generation, reason=reason)
        if self._fail is not None and not self._fail.done():
            self._failed_generation = rd.generation
            self._fail.set_result(reason)

    # ------------------------------------------------------------------------------------------ supervision
    async def supervise(self, job: Callable[[int | None], Awaitable[None]]) -> None:
        """`await job(None)`; whenever the training group fails meanwhile, stop it, restart the group from the last
        checkpoint and `await job(rollout id to carry on from)` instead. Other errors end the job."""
        resume_at: int | None = None
        while True:
            task: asyncio.Future[Any] = asyncio.ensure_future(job(resume_at))
            fail = self.failing
            try:
                await asyncio.wait([task, fail], return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                # the controller stops (the job ended elsewhere: an actor could not start): the job stops with it.
                # Its error is the stop's consequence (an ask on a closed mailbox), not news: retrieved, not logged
                # as "Task exception was never retrieved" after the job's cause
                task.cancel()
                task.add_done_callback(outcome_seen)
                raise
            if task.done() and not fail.done():
                exc = task.exception()
                if exc is None:
                    return
                reason = await self._failure_reason(exc)
                if reason is None:
                    raise exc
            else:
                reason = fail.result()
                task.cancel()
                try:
                    await task
                except BaseException:  # cancelled, or the failure itself
                    pass
            resume_at = await self.restart(reason)

    async def _failure_reason(self, exc: BaseException) -> str | None:
        """A trainer error is a group failure when a rank is gone; an error the ranks raised while all are alive
        (a bug, a bad batch) is not retried. A survivor's collective fails before the directory notices the dead
        rank, so wait for the confirmation a little."""
        if not isinstance(exc, GroupFailed) or not exc.member.startswith("trainer/"):
            return None
        if exc.confirmed:
            self.failed(str(exc))
            return str(exc)
        try:
            return await asyncio.wait_for(asyncio.shield(self.failing), 2 * self.ctl.runtime.down_after + 5)
        except asyncio.TimeoutError:
            return None

    async def restart(self, reason: str) -> int:
        """Restart the training group from the last checkpoint; returns the rollout id to carry on from."""
        ctl, t0 = self.ctl, time.monotonic()
        # (a rank that restarted may have opened the next generation already: tell the failed one to leave)
        failed = self._failed_generation if self._failed_generation is not None else self.current.generation
        self._failed_generation = None
        now = ctl.wall_time()  # (a recorded clock reading: it decides whether the job gives up)
        rec = {"time": now, "reason": reason, "failed_at_rollout": ctl.rollout_id, "failed_generation": failed}
        window = [r for r in self.recoveries if now - r["time"] < 600]
        if len(window) >= MAX_GROUP_RESTARTS:
            raise RuntimeError(f"the training group failed {len(window) + 1} times within 600 s (limit "
                               f"{MAX_GROUP_RESTARTS}); last: {reason}")
        ctl.phase = "recovering"
        if self.current.generation == failed:
            self.next_generation()  # the restarted ranks rendezvous in a new generation
        # else a restarted rank has opened the next generation already (trainer_join), and its ranks may have formed
        # it and be loading the checkpoint: opening yet another would leave them, and this wait, in different ones
        self._fail = asyncio.get_running_loop().create_future()
        ckpt = ctl.checkpoints.latest
        ctl.log.error("restarting the training group from the last checkpoint", reason=reason,
                      checkpoint=str(ckpt) if ckpt else "none (initial weights)")
        # survivors leave the broken group (exit 75); their supervisor restarts them
        await ctl.trainers.tell.quietly.abort_group(generation=failed, reason=reason)
        await ctl.engines.end_rollout(ctl.rollout_id)
        start, ctl.version = ctl.checkpoints.restore()
        # (the token names this controller process too: a restarted controller counts recoveries and generations
        # from 0 again, and the buffer answers a token it ran last from its record)
        token = f"recovery-{len(self.recoveries)}-{failed}-{ctl.start_token()}"
        rb = await ctl.checkpoints.rollback_buffer(start, reason, token=token, timeout=600)
        ctl.metrics.drop_from(start)
        ctl.engines.forget_versions()
        rec.update(resumed_from=start, weight_version=ctl.version, checkpoint=str(ckpt) if ckpt else None,
                   buffer=rb, prepare_seconds=round(time.monotonic() - t0, 3))
        self.recoveries.append(rec)
        self.write(rec)
        return start

    async def rejoin(self, start: int) -> int:
        """After a restart: the new generation loads the checkpoint, the engines get its weights; returns `start`."""
        t0 = time.monotonic()
        await self.ready()
        rec = self.recoveries[-1]
        rec["trainers_ready_seconds"] = round(time.monotonic() - t0, 3)
        if not self.ctl.cfg.debug.debug_train_only:
            await self.ctl.engines.sync_at_start()
        rec["resumed_seconds"] = round(time.monotonic() - t0 + rec["prepare_seconds"], 3)
        self.ctl.log.info("training group restarted", generation=self.current.generation, resume_from=start,
                          seconds=rec["resumed_seconds"])
        return start

    def write(self, rec: dict) -> None:
        """Append a recovery to RUN_DIR/recoveries.jsonl."""
        with open(Path(self.ctl.runtime.run_dir) / "recoveries.jsonl", "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")


__all__ = ["TrainingGroup", "Rendezvous", "MAX_GROUP_RESTARTS"]
