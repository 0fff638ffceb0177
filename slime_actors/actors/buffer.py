"""The buffer (broker): prompts in, groups out to rollout workers, scored groups back, shards out to trainer ranks.

It owns the record of what was handed out and what came back, so a rollout worker that dies never loses or
duplicates a sample: its leases are re-issued (`release_worker`, also on the directory's `_peer_down`), a late or
duplicate submission is refused, and every sample's history (issued, submitted, trained) is kept in `accounting`.

The record and its rules are the state machine in slime_actors/buffer_state.py (no asyncio, no files); this actor
decodes the messages (a Sample once, here), appends each event the state machine applies to the log, writes the
snapshots and wakes the waiters. The state is persisted as an append-only event log under RUN_DIR/buffer/
(compacted into a snapshot after each trained rollout); a restarted buffer replays it and carries on -- leases
included, so workers that were mid-way can still hand their groups in.

A group moves: queued -> leased -> (completed | filtered | failed) -> trained; or leased -> queued again when it is
returned (end of a rollout, engine restart, dead worker). With --partial-rollout, returned samples keep their partial
responses and are continued where they stopped.

When a training rollout completes, the reward-hacking monitor (slime_actors/monitor: --hack-alarms) reads every
scored sample the model produced for it -- the trained groups and the groups the dynamic filter dropped -- and
`wait_rollout` returns what it found as the stats' `hack` entry (hack/* metrics, tripped alarms with an example), or,
asked with hack=false (the controller: training need not wait for it), replies at once and `hack_report` answers it
-- computed once every trainer rank has taken its shard, like --save-debug-rollout-data's `dump_rollout`, so neither
delays a `get_batch` at the start of the step. The monitor's state is persisted with the buffer's (log, snapshot,
checkpoint), so a restart or a rollback carries it.

After a restart it asks each worker that held leases which groups it still has (`held_groups`) and re-issues the
rest (a lease recorded just before the crash whose reply never reached the worker). When the training group restarts
from a checkpoint, `rollback` brings the buffer back to that checkpoint's snapshot: rollouts trained after it are
trained again -- once -- by the restored weights. `accounting` counts samples per lineage (trained exactly once by
the weights that survive) and reports what the lost weights had trained (`discarded`) and every rollback.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import BinaryIO
from pathlib import Path

import msgpack

from ..buffer_state import DONE, STALE_REASON, BufferLogError, BufferSettings, BufferState, Group, Rollout, event_view
from ..monitor.alarms import failed_wire, make_monitor, report_wire
from ..role_handles import RolloutHandle
from ..types import Sample, packed_columns
from .base import Actor, handler

# the persisted log is folded into a snapshot every this many trained rollouts, or once it grows past this size
COMPACT_EVERY = 10
COMPACT_LOG_BYTES = 8 << 20
# a rollout's reports (hack report, debug dump) wait at most this long for every trainer rank to take its shard
REPORTS_WAIT_FOR_BATCH = 60.0


_RECORD = b"\x93"   # a log record is a msgpack array of three: name, time, fields


def _pack_event(data: dict) -> bytes:
    """An event's fields packed for the log before the event is applied, without copying its samples first."""
    return msgpack.packb(event_view(data), use_bin_type=True)


class Buffer(Actor):
    role = "buffer"
    needs_job = True

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.plugin_args = self.cfg.flat()   # what the dynamic sampling filter gets (slime's `args`)
        # the record (buffer_state.py); its prompts and filter arrive in on_start
        self.state = BufferState(BufferSettings.from_config(self.cfg), clock=self._now,
                                 monitor_factory=lambda: make_monitor(self.cfg), on_event=self._append,
                                 encode=_pack_event)
        self._changed = asyncio.Condition()   # the record changed: wakes get_work's waiters
        self._releases: dict[str, int] = {}   # per worker name: how many times its groups were released
        self._rollout_events: dict[str, asyncio.Event] = {}
        self._log_file: BinaryIO | None = None
        self._trained_since_compact = 0
        self._hack_lock = asyncio.Lock()
        # per training rollout: the trainer ranks that took their shard, and an event set once all of them did
        self._served: dict[int, set[int]] = {}
        self._batch_out: dict[int, asyncio.Event] = {}
        self._complete_at_start: set[int] = set()   # complete when this process started (a restart): not waited for
        # trainer shards made before they were asked for (`_make_batches`), by (rollout, rank, world size, packed),
        # and the (world size, packed) the ranks last asked with
        self._batches: dict[tuple[int, int, int, bool], dict] = {}
        self._batch_shape: tuple[int, bool] | None = None
        # each done training group's packed columns (types.packed_columns), made as it is handed in -- while the
        # buffer waits for the rest of the rollout -- with the samples list they were made of: a shard then joins them
        # (`_columns_of`); forgotten once the rollout is trained or rolled back
        self._columns: dict[str, tuple[list, dict]] = {}
        # rollbacks run one at a time; a repeat of one still running (its token) waits for that one's reply
        self._rollback_lock = asyncio.Lock()
        self._rollbacks_running: dict[str, asyncio.Future[dict]] = {}

    @property
    def hack_monitor(self):
        """The reward-hacking monitor (None with --hack-alarms off)."""
        return self.state.hack_monitor

    # ------------------------------------------------------------------------------------------ start-up
    async def on_start(self) -> None:
        from ..data import load_prompt_data
        self.state.dataset, self.state.eval_sets = await self.run_blocking(load_prompt_data, self.cfg)
        if self.cfg.rollout.dynamic_sampling_filter_path:
            from ..filters import DynamicFilter
            keep = DynamicFilter(self.cfg.rollout.dynamic_sampling_filter_path)
            self.state.keep_group = lambda samples: bool(keep(self.plugin_args, samples))
        self.state_dir = Path(self.runtime.run_dir) / "buffer"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        restored = self._restore()
        self._log_notes()
        # the ranks may have taken these rollouts' shards from the process before this one: no report waits for them
        self._complete_at_start = {r.rollout_id for r in self.state.rollouts.values()
                                   if r.kind == "train" and r.done and not r.trained}
        if restored == "fresh":  # what a training group with no checkpoint yet rolls back to
            self._write_snapshot(self.state_dir / "initial.msgpack")
            self._compact()
        else:
            self._log_file = open(self.state_dir / "log.msgpack", "ab")
            self.spawn(self._reconcile_leases(), name="reconcile")
        dataset = self.state.dataset
        self.log.info("buffer ready", prompts=len(dataset) if dataset is not None else 0,
                      eval_sets=list(self.state.eval_sets), restored=restored)

    async def _reconcile_leases(self) -> None:
        """After a restart: a lease logged just before the crash may never have reached its worker. Ask each
        worker holding leases what it still has and re-issue the rest. A worker that does not answer keeps its
        leases: it may still hand them in, and if it is dead the directory's _peer_down (or its restart) releases
        them."""
        for worker, wids in self.state.held_leases().items():
            try:
                worker_handle = RolloutHandle(self, worker)
                has = set(await worker_handle.held_groups(ask_timeout=max(10.0, self.runtime.down_after * 2)))
            except Exception as exc:
                self.log.warning("worker did not say what it holds; its leases stay", worker=worker,
                                 error=str(exc))
                continue
            n = self.state.requeue_unheld(worker, wids, has)
            if n:
                self.log.warning("re-issued groups a worker no longer holds", worker=worker, groups=n)
                self._notify()

    async def on_stop(self) -> None:
        if self._log_file is not None:
            self._log_file.close()

    async def on_peer_down(self, name: str, reason: str) -> None:
        if name.startswith("rollout/"):
            n = self._release(name)
            if n:
                self.log.warning("re-issued a dead worker's groups", worker=name, groups=n)

    def _now(self) -> float:
        """Wall-clock time as a recorded input (wait_rollout's `seconds` depend on it; replay serves it back)."""
        return self.recorded("clock", time.time)

    def _log_notes(self) -> None:
        for msg, fields in self.state.notes:
            self.log.warning(msg, **fields)
        self.state.notes.clear()

    # ------------------------------------------------------------------------------------------ persistence
    def _append(self, ev: str, packed: bytes) -> None:
        """The state's sink: one applied event (its fields packed before it was applied, `_pack_event`), appended to
        the log as the record [name, time, fields]."""
        if self._log_file is None:
            return
        self._log_file.write(_RECORD + msgpack.packb(ev) + msgpack.packb(time.time()) + packed)
        self._log_file.flush()

    def _snapshot_state(self) -> dict:
        return self.state.snapshot()

    def _write_snapshot(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(msgpack.packb(self.state.snapshot(), use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _compact(self) -> None:
        """Snapshot the state and start an empty log (after each trained rollout). The log starts with the
        snapshot's generation: a crash between the two writes leaves an old log that _restore then ignores."""
        self.state.log_gen += 1
        self._trained_since_compact = 0
        self._write_snapshot(self.state_dir / "snapshot.msgpack")
        if self._log_file is not None:
            self._log_file.close()
        self._log_file = log = open(self.state_dir / "log.msgpack", "wb")
        log.write(msgpack.packb(["gen", time.time(), {"gen": self.state.log_gen}], use_bin_type=True))
        log.flush()

    def _restore(self) -> str:
        """Rebuild state: checkpoint (--load), else this run's snapshot + log, else fresh."""
        snap = self.state_dir / "snapshot.msgpack"
        log = self.state_dir / "log.msgpack"
        how = "fresh"
        from ..checkpoints import resolve_load
        ckpt = resolve_load(self.cfg)  # (checked by the head before the job started)
        if ckpt is not None and (ckpt / "buffer.msgpack").exists() and not snap.exists() and not log.exists():
            self.state.load(_read(ckpt / "buffer.msgpack"))
            return f"checkpoint {ckpt}"
        if snap.exists():
            self.state.load(_read(snap))
            how = "snapshot"
        if log.exists() and log.stat().st_size:
            up = msgpack.Unpacker(raw=False, strict_map_key=False)
            up.feed(log.read_bytes())
            events = []
            for rec in _records(up):
                if rec[0] == "gen":
                    if rec[2]["gen"] != self.state.log_gen:  # a log older than the snapshot: already in it
                        how += " (stale log ignored)"
                        break
                    continue
                events.append(rec)
            try:
                n = self.state.replay(events)
            except BufferLogError as exc:
                raise BufferLogError(f"{log}: {exc}") from None
            how += f" + {n} logged events"
        if how != "fresh":
            # groups leased at the crash stay leased: their workers may still hand them in; if those workers are
            # gone the directory's _peer_down (or their restart) releases them.
            self._wake_rollouts()
        return how

    # ------------------------------------------------------------------------------------------ waking
    def _release(self, worker: str) -> int:
        self._releases[worker] = self._releases.get(worker, 0) + 1
        n = self.state.release(worker)
        if n:
            self._notify()
        return n

    def _notify(self) -> None:
        async def wake():
            async with self._changed:
                self._changed.notify_all()
        if self.running:   # (not before the buffer started: no one waits yet)
            self.spawn(wake(), name="notify")

    def _wake_rollouts(self) -> None:
        for key, r in self.state.rollouts.items():
            if r.done:
                self._rollout_events.setdefault(key, asyncio.Event()).set()

    # ------------------------------------------------------------------------------------------ handlers
    @handler
    async def start_rollout(self, rollout_id: int, kind: str = "train", weight_version: int = 0,
                            name: str = "", hold: bool | None = None) -> dict:
        reply = self.state.start_rollout(rollout_id, kind, weight_version, name, hold=bool(hold))
        if reply.get("existing") or reply.get("held"):
            return reply   # (nothing to hand out: no one to wake)
        for key in [k for k, r in self.state.rollouts.items() if r.released is not None]:
            self._rollout_events.pop(key, None)   # evaluations released by this start (one event per eval, kept)
        self._notify()
        if self.state.rollouts[f"{kind}:{rollout_id}"].done:
            self._wake_rollouts()
        return reply

    @handler
    async def get_work(self, worker: str, max_groups: int, wait: float = 0.0, ahead: bool | None = None) -> dict:
        if ahead:   # the held rollout's groups, which the worker starts once its engine has their weights
            groups, version = self.state.take_ahead(worker, max_groups)
            return {"groups": groups, "weight_version": version}
        clock = self.monotonic  # recorded clock readings: replay takes the same turns
        deadline = clock() + wait
        releases = self._releases.get(worker, 0)
        while True:
            if self._releases.get(worker, 0) != releases:
                # the worker's groups were released while this ask waited: it is a process the release was about
                # (killed, restarted: its reply would be lost) and the groups it would take, leased to its name,
                # would wait for their lease to run out instead of going to the new process
                return {"groups": []}
            out = self.state.take(worker, max_groups)
            if out or clock() >= deadline:
                return {"groups": out}
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), max(0.0, deadline - clock()))
                except asyncio.TimeoutError:
                    pass

    @handler
    async def submit(self, worker: str, work_id: str, samples: list) -> dict:
        parsed = [Sample.from_wire(s) for s in samples]   # decoded once, here; encoded once, for the log
        try:
            reply = self.state.submit(worker, work_id, parsed)
        finally:
            self._log_notes()
        if reply["accepted"]:
            self._wake_waiters(work_id)
            if reply["outcome"] == DONE and (self._batch_shape is None or self._batch_shape[1]):
                self._pack_soon(work_id)
        if reply["accepted"] or reply["reason"] == STALE_REASON:
            self._notify()
        return reply

    def _pack_soon(self, work_id: str) -> None:
        """Done training group `work_id`'s packed columns (`_columns`), made once this submit's reply is on its way --
        while the buffer waits for the rest of the rollout. Not for the group that completed it: wait_rollout's
        reply, on the step's critical path, would wait for them (the shard makes them after it: `_columns_of`)."""
        g = self.state.groups[work_id]
        r = self.state.rollouts.get(f"train:{g.rollout_id}")
        if g.kind == "train" and r is not None and not r.done:
            asyncio.get_running_loop().call_soon(self._pack_columns, work_id)

    def _pack_columns(self, work_id: str) -> None:
        """Runs on the loop's turn after the submit. Not once the rollout is complete: at a rollout's end several groups
        come in one burst, their packings queue behind its last submit, and wait_rollout's reply -- which starts the
        trainers -- would wait for all of them; the shard, made after that reply, packs what is left."""
        g = self.state.groups.get(work_id)
        if g is None or g.kind != "train" or g.state != DONE:
            return
        r = self.state.rollouts.get(f"train:{g.rollout_id}")
        if r is not None and not self.state.settled(r):
            self._columns_of(g)

    def _columns_of(self, g: Group) -> dict | None:
        """Group `g`'s packed columns: those made when it was handed in if they are of its samples as they are,
        else made now; None when they cannot be (a row that is not numbers: the shard packed whole says where)."""
        made = self._columns.get(g.work_id)
        if made is not None and made[0] is g.samples:
            return made[1]
        try:
            columns = packed_columns(g.samples)
        except ValueError:
            self._columns.pop(g.work_id, None)
            return None
        self._columns[g.work_id] = (g.samples, columns)
        return columns

    def _wake_waiters(self, work_id: str) -> None:
        """Group `work_id` has an outcome: those waiting for its rollout (wait_rollout, wait_batch) wake if the
        rollout is complete -- or failed (`rollout_failure`): wait_rollout says why."""
        g = self.state.groups.get(work_id)
        if g is None:
            return
        key = f"{g.kind}:{g.rollout_id}"
        r = self.state.rollouts.get(key)
        if r is not None and self.state.settled(r):
            self._rollout_events.setdefault(key, asyncio.Event()).set()

    @handler
    async def return_work(self, worker: str, work_id: str, samples: list | None = None,
                          reason: str = "", failed: bool = False) -> dict:
        """A worker gives group `work_id` back (`reason`: why, for the log); `failed`: its generation raised or its
        samples were refused, `reason` says how -- counted toward the group's errors (buffer_state.MAX_GROUP_ERRORS;
        then the group is recorded as failed)."""
        parsed = None if samples is None else [Sample.from_wire(s) for s in samples]
        try:
            reply = self.state.return_work(worker, work_id, parsed, error=(reason or "failed") if failed else None)
        finally:
            self._log_notes()
        if reply["requeued"]:
            self._notify()
        elif reply.get("failed"):
            self._wake_waiters(work_id)
            self._notify()   # (a worker waiting for work: the rollout needs another group in its place)
        return reply

    @handler
    async def release_worker(self, worker: str, reason: str = "") -> dict:
        n = self._release(worker)
        if n:
            self.log.warning("released a worker's groups", worker=worker, groups=n, reason=reason)
        return {"requeued": n}

    @handler
    async def wait_rollout(self, rollout_id: int, kind: str = "train", timeout: float = 3600.0,
                           hack: bool = True) -> dict:
        """The rollout's statistics once it is complete (or `timeout` passed). A complete training rollout's hack
        report (--hack-alarms) is computed now; `hack` false: the reply does not wait for it (the controller asks
        `hack_report` while the trainers train)."""
        key = f"{kind}:{rollout_id}"
        if key not in self.state.rollouts:
            raise KeyError(f"rollout {key} was never started")
        await self._until_complete(key, timeout)
        r = self.state.rollouts[key]
        failure = self.state.rollout_failure(r)
        if failure is not None:
            raise RuntimeError(failure)
        stats = self.state.rollout_stats(key)
        if r.kind == "train" and r.done and not r.trained:   # (the trainers check the shard they fetched ahead
            stats["batch_id"] = self.state.batch_id(r.rollout_id)  # against it: wait_batch)
        if r.kind == "train" and r.done and self.state.hack_monitor is not None:
            if not hack:   # (hack_report waits for it; it starts once the trainers have their shards)
                self.spawn(self._observe_hack(r, after_batch=True), name="hack-monitor")
                self._make_batches(r)
                return stats
            report = await self._observe_hack(r)
            if report is not None:
                stats["hack"] = report
        if r.kind == "train" and r.done:
            self._make_batches(r)
        return stats

    def _make_batches(self, r: Rollout) -> None:
        """Complete training rollout `r` was just reported to the controller: its trainer shards are made now -- by
        a task that runs once this reply is sent -- while that reply, the controller's `train` and each rank's
        `get_batch` travel, and `get_batch` answers with them. As the ranks asked last time (no guess before a
        first `get_batch`); never with --debug-rollout-only (no trainer asks)."""
        shape = self._batch_shape
        if shape is None or r.trained or self.cfg.debug.debug_rollout_only:
            return
        world_size, packed = shape

        async def make() -> None:
            for rank in range(world_size):
                key = (r.rollout_id, rank, world_size, packed)
                if key in self._batches or rank in self._served.get(r.rollout_id, ()) or r.trained or \
                        self.state.rollouts.get(f"train:{r.rollout_id}") is not r:
                    continue   # (made, or taken already; trained, or rolled back meanwhile)
                try:
                    self._batches[key] = self.state.batch(r.rollout_id, rank, world_size, packed=packed,
                                                          columns_of=self._columns_of)
                except Exception:   # (get_batch makes it when asked, and reports what is wrong)
                    return
                await asyncio.sleep(0)   # (a rank's get_batch that arrived meanwhile is answered first)
        self.spawn(make(), name="batches")

    @handler
    async def hack_report(self, rollout_id: int) -> dict | None:
        """The hacking monitor's report on complete training rollout `rollout_id` (None with --hack-alarms off, or
        once it is trained). Asked while the trainers train: it is computed once every rank has its shard."""
        r = self.state.completed_rollout(rollout_id)
        if self.state.hack_monitor is None:
            return None
        return await self._observe_hack(r, after_batch=True)

    async def _after_batch(self, rollout_id: int) -> None:
        """Wait until every trainer rank has taken its shard of training rollout `rollout_id` (get_batch), or it is
        trained or rolled back: the reports on a rollout (hack report, debug dump) are asked for while the trainers
        train, and computing them first -- the monitor's thread holds the GIL, a dump packs every sample -- made
        each rank's get_batch wait at the start of its step. Nothing waits with --debug-rollout-only (no trainer
        asks), for a rollout complete before this process started (a restart), or longer than
        REPORTS_WAIT_FOR_BATCH seconds (a warning says so)."""
        if self.cfg.debug.debug_rollout_only or rollout_id in self._complete_at_start:
            return
        r = self.state.rollouts.get(f"train:{rollout_id}")
        if r is None or r.trained:
            return
        ev = self._batch_out.setdefault(rollout_id, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), REPORTS_WAIT_FOR_BATCH)
        except asyncio.TimeoutError:
            self.log.warning("the trainers did not take their shards; the rollout's reports go ahead",
                             rollout_id=rollout_id, seconds=REPORTS_WAIT_FOR_BATCH,
                             ranks_served=sorted(self._served.get(rollout_id, ())))

    def _batch_taken(self, rollout_id: int, rank: int, world_size: int) -> None:
        """Rank `rank` of `world_size` took its shard of rollout `rollout_id`: the reports waiting for it go ahead
        once every rank has."""
        ranks = self._served.setdefault(rollout_id, set())
        ranks.add(rank)
        if len(ranks) >= world_size:
            self._batch_out.setdefault(rollout_id, asyncio.Event()).set()

    def _rollout_done_with(self, rollout_id: int) -> None:
        """Rollout `rollout_id` is trained or rolled back: what waits for its shards goes ahead, and is forgotten."""
        for key in [key for key in self._batches if key[0] == rollout_id]:
            del self._batches[key]
        groups = self.state.groups
        for wid in [wid for wid, (samples, _) in self._columns.items()
                    if wid not in groups or groups[wid].samples is not samples or groups[wid].rollout_id == rollout_id]:
            del self._columns[wid]
        self._served.pop(rollout_id, None)
        ev = self._batch_out.pop(rollout_id, None)
        if ev is not None:
            ev.set()

    async def _observe_hack(self, r: Rollout, after_batch: bool = False) -> dict | None:
        """The hacking monitor's report of a completed training rollout, computed once (in a thread: a large
        rollout's text takes a while; one rollout at a time: the monitor's state goes from one to the next) and
        kept until the rollout is trained; None once it is trained and the report is gone. Every scored sample
        counts: the groups trained on and the ones the filter dropped. `after_batch`: not before the trainers have
        their shards (`_after_batch`)."""
        if after_batch:
            await self._after_batch(r.rollout_id)
        async with self._hack_lock:
            st = self.state
            if r.rollout_id in st.hack_reports or r.trained:
                return st.hack_reports.get(r.rollout_id)
            samples = st.hack_samples(r)
            # observed on a copy: a snapshot taken meanwhile (save, compaction) reads a state that is whole
            monitor, epoch = st.hack_monitor, st.epoch
            work = make_monitor(self.cfg)
            if monitor is None or work is None:   # (--hack-alarms off: not asked)
                return None
            work.load_state_dict(monitor.state_dict())
            try:
                report = report_wire(await self.run_blocking(work.observe, r.rollout_id, samples))
                state = work.state_dict()
            except Exception as exc:  # the monitor must never stop training: the controller warns
                self.log.warning("hack monitor failed", rollout_id=r.rollout_id, error=repr(exc))
                report, state = failed_wire(r.rollout_id, exc), monitor.state_dict()
            if epoch != st.epoch or monitor is not st.hack_monitor:
                return None  # rolled back meanwhile: this rollout's samples and the monitor's state are gone
            st.record_hack(r.rollout_id, report, state)
            return report

    @handler
    async def get_batch(self, rollout_id: int, rank: int, world_size: int, packed: bool | None = None) -> dict:
        return self._shard(rollout_id, rank, world_size, bool(packed))

    @handler
    async def wait_batch(self, rollout_id: int, rank: int, world_size: int, packed: bool | None = None,
                         timeout: float | None = 3600.0) -> dict | None:
        """A trainer rank's shard of training rollout `rollout_id`, asked for before the rollout is complete (right
        after the rank trained on the one before): answered once it is, with the batch's id (`batch_id`), so the
        shard is at the rank when the controller's `train` comes -- it names the id it was told by wait_rollout,
        and the rank trains on this shard only if that is its id. None when `timeout` s (None: no limit) pass first,
        or when the rollout was rolled back or trained meanwhile."""
        key = f"train:{rollout_id}"
        try:
            if not await self._until_complete(key, timeout):
                return None
        except asyncio.CancelledError:
            if self.running:
                raise
            return None   # (the buffer stops -- the job ended, a rollout after it was asked for --: no error)
        # (the controller's wait_rollout, woken by the same submit, replies first: its `train` is on its way while
        # this shard is made)
        await asyncio.sleep(0)
        r = self.state.rollouts.get(key)
        if r is None or not r.done or r.trained:   # (a rollback woke it)
            return None
        return {"batch_id": self.state.batch_id(rollout_id),
                "batch": self._shard(rollout_id, rank, world_size, bool(packed))}

    async def _until_complete(self, key: str, timeout: float | None) -> bool:
        """Wait until rollout `key` ("train:3") is complete -- started or not yet --, or failed (`rollout_failure`),
        or a rollback wakes its waiters; False when `timeout` s passed first."""
        ev = self._rollout_events.setdefault(key, asyncio.Event())
        r = self.state.rollouts.get(key)
        if r is not None and self.state.settled(r):
            ev.set()
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def _shard(self, rollout_id: int, rank: int, world_size: int, packed: bool) -> dict:
        """Rank `rank` of `world_size`'s shard of complete training rollout `rollout_id` (made ahead if it was:
        `_make_batches`); the reports waiting for the shards go ahead once every rank has its own."""
        self._batch_shape = (world_size, packed)
        made = self._batches.pop((rollout_id, rank, world_size, packed), None)
        batch = made if made is not None else self.state.batch(rollout_id, rank, world_size, packed=packed,
                                                               columns_of=self._columns_of)
        self._batch_taken(rollout_id, rank, world_size)
        return batch

    @handler
    async def mark_trained(self, rollout_id: int) -> None:
        self._rollout_done_with(rollout_id)
        if not self.state.mark_trained(rollout_id):
            return
        self._rollout_events.pop(f"train:{rollout_id}", None)  # (one per step, kept: the actor's growth otherwise)
        # the log is replayed on a restart; folding it into a new snapshot (packing the state, an fsync) costs
        # milliseconds a step, so it happens every COMPACT_EVERY trained rollouts, or once the log is large
        self._trained_since_compact += 1
        if self._trained_since_compact >= COMPACT_EVERY or (
                self._log_file is not None and self._log_file.tell() > COMPACT_LOG_BYTES):
            self._compact()

    @handler
    def accounting(self) -> dict:
        return self.state.accounting()

    @handler
    async def save(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        data = msgpack.packb(self.state.snapshot(), use_bin_type=True)  # on the loop: state does not move

        def write():
            tmp = Path(path) / "buffer.msgpack.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, Path(path) / "buffer.msgpack")
        await self.run_blocking(write)

    @handler
    async def rollback(self, path: str | None = None, if_ahead_of: int = 0, reason: str = "",
                       token: str = "") -> dict:
        """Bring the buffer back to a checkpoint's snapshot (`path`, an iter_N directory; None: the run's start)
        when it holds rollouts from `if_ahead_of` on -- the training group restarted from that checkpoint, so the
        weights that trained those rollouts are gone. Their samples are handed out and trained again, exactly once
        by the restored weights; `accounting` reports the discarded trainings.

        Idempotent per `token`: the controller asks again with the same token when a reply does not come (one lost
        on a link that reconnected). A repeat that arrives while the first is still running waits for it and gets
        its reply (or its error); one that arrives after it is answered from the record (`rollback_answer`).
        Rollbacks with different tokens run one after the other."""
        running = self._rollbacks_running.get(token) if token else None
        if running is not None:
            self.log.info("rollback asked again while it runs; answering with its reply", token=token)
            return await asyncio.shield(running)
        done: asyncio.Future[dict] = asyncio.get_running_loop().create_future()
        if token:
            self._rollbacks_running[token] = done
        try:
            async with self._rollback_lock:
                result = await self._rollback(path, if_ahead_of, reason, token)
        except asyncio.CancelledError:
            done.cancel()
            raise
        except Exception as exc:
            done.set_exception(exc)
            done.exception()  # (retrieved: no repeat may be waiting)
            raise
        else:
            done.set_result(result)
        finally:
            if self._rollbacks_running.get(token) is done:
                del self._rollbacks_running[token]
        return result

    async def _rollback(self, path: str | None, if_ahead_of: int, reason: str, token: str) -> dict:
        answer = self.state.rollback_answer(if_ahead_of, bool(path), token)
        if answer is not None:
            return answer
        src = Path(path) / "buffer.msgpack" if path else self.state_dir / "initial.msgpack"
        if not src.exists():
            if self.state.fresh:
                return {"rolled_back": False, "reason": f"no buffer snapshot at {src}; starting fresh"}
            raise FileNotFoundError(f"rollback: no buffer snapshot at {src}")
        st = await self.run_blocking(_read, src)
        for ev in self._rollout_events.values():  # wake stale waiters; their askers are gone
            ev.set()
        self._rollout_events.clear()
        for rid in list(self._batch_out):         # reports waiting for shards of rollouts that are gone
            self._rollout_done_with(rid)
        self._served.clear()
        self._batches.clear()
        result = self.state.rollback(st, str(src), if_ahead_of, reason, token)
        self._log_notes()
        self._compact()
        self._wake_rollouts()
        self._notify()
        self.log.warning("rolled back to a checkpoint", **{k: v for k, v in result.items() if k != "rolled_back"})
        return result

    @handler
    def eval_results(self, rollout_id: int) -> list:
        return self.state.eval_results(rollout_id)

    @handler
    async def dump_rollout(self, rollout_id: int) -> list:
        """A complete rollout's samples (--save-debug-rollout-data), once the trainers have their shards."""
        self.state.completed_rollout(rollout_id)   # (an error at once for one that is not complete)
        await self._after_batch(rollout_id)
        return self.state.dump_rollout(rollout_id)

    @handler
    async def load_rollout(self, rollout_id: int, samples: list) -> dict:
        """Insert recorded samples as a complete rollout (training from saved rollouts, no engine)."""
        reply = self.state.load_rollout(rollout_id, [Sample.from_wire(s) for s in samples])
        self._wake_rollouts()
        return reply


def _read(path: Path) -> dict:
    return msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)


def _records(up):
    while True:
        try:
            rec = up.unpack()
        except msgpack.OutOfData:
            return  # a record cut short by a crash: everything before it is intact
        yield rec
