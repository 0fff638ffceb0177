"""The buffer (broker): prompts in, groups out to rollout workers, scored groups back, shards out to trainer ranks.

It owns the record of what was handed out and what came back, so a rollout worker that dies never loses or
duplicates a sample: its leases are re-issued (`release_worker`, also on the directory's `_peer_down`), a late or
duplicate submission is refused, and every sample's history (issued, submitted, trained) is kept in `accounting`.

Its state is persisted as an append-only event log under RUN_DIR/buffer/ (compacted into a snapshot after each
trained rollout); a restarted buffer replays it and carries on -- leases included, so workers that were mid-way
can still hand their groups in.

A group moves: queued -> leased -> (completed | filtered | failed) -> trained; or leased -> queued again when it is
returned (end of a rollout, engine restart, dead worker). With --partial-rollout, returned samples keep their partial
responses and are continued where they stopped.

When a training rollout completes, the reward-hacking monitor (slime_actors/monitor: --hack-alarms) reads every
scored sample the model produced for it -- the trained groups and the groups the dynamic filter dropped -- and
`wait_rollout` returns what it found as the stats' `hack` entry (hack/* metrics, tripped alarms with an example);
the monitor's state is persisted with the buffer's (log, snapshot, checkpoint), so a restart or a rollback carries
it.

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
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from ..config import JobConfig
from ..monitor.alarms import failed_wire, make_monitor, report_wire
from ..samples import pick_examples
from ..types import ABORTED, COMPLETED, FAILED, PENDING, TRUNCATED, Sample, batch_from_samples
from .base import Actor, handler

QUEUED, LEASED, DONE, FILTERED, GROUP_FAILED, TRAINED = "queued", "leased", "done", "filtered", "failed", "trained"


# the persisted log is folded into a snapshot every this many trained rollouts, or once it grows past this size
COMPACT_EVERY = 10
COMPACT_LOG_BYTES = 8 << 20


@dataclass
class Group:
    work_id: str
    rollout_id: int
    kind: str
    group_index: int
    samples: list[Sample]
    sampling_params: dict
    state: str = QUEUED
    worker: str | None = None
    attempts: int = 0
    error: str | None = None

    def wire(self) -> dict:
        return {"work_id": self.work_id, "rollout_id": self.rollout_id, "kind": self.kind,
                "group_index": self.group_index, "sampling_params": self.sampling_params,
                "samples": [s.to_wire() for s in self.samples], "attempt": self.attempts}

    def record(self) -> dict:
        d = self.wire()
        d.update(state=self.state, worker=self.worker, error=self.error)
        return d

    @classmethod
    def from_record(cls, d: dict) -> "Group":
        return cls(d["work_id"], d["rollout_id"], d["kind"], d["group_index"],
                   [Sample.from_wire(s) for s in d["samples"]], d["sampling_params"], d["state"], d.get("worker"),
                   d.get("attempt", 0), d.get("error"))


@dataclass
class Rollout:
    rollout_id: int
    kind: str
    target: int                  # groups needed
    name: str = ""
    weight_version: int = 0
    completed: list[str] = field(default_factory=list)
    filtered: int = 0
    failed: int = 0
    done: bool = False
    trained: bool = False
    started: float = field(default_factory=time.time)
    finished: float | None = None


class Buffer(Actor):
    role = "buffer"

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.cfg = JobConfig.from_dict(config["args"])
        self.plugin_args = self.cfg.flat()   # what the dynamic sampling filter gets (slime's `args`)
        self.groups: dict[str, Group] = {}
        self.queue: dict[str, deque[str]] = {"train": deque(), "eval": deque()}
        self.rollouts: dict[str, Rollout] = {}
        self.accounts: dict[int, list[int]] = {}  # sample index -> [issued, submitted, trained]
        self.next_sample = 0
        self.next_group = 0
        self.weight_version = 0
        self.active: dict[str, int | None] = {"train": None, "eval": None}
        self.carried: deque[str] = deque()  # complete groups that arrived after their rollout was full
        self.dataset = None
        self.eval_sets: dict = {}
        self._changed: asyncio.Condition | None = None
        self._rollout_events: dict[str, asyncio.Event] = {}
        self._log_file = None
        self._trained_since_compact = 0
        self._replaying = False
        self.filter_fn = None
        self.stats = {"handed_out": 0, "submitted": 0, "duplicates": 0, "requeued": 0, "stale_requeued": 0}
        # history that outlives rollbacks: epoch (bumped by each), samples trained into lost weights, the rollbacks
        self.epoch = 0
        self.discarded: dict[int, int] = {}
        self.rollbacks: list[dict] = []
        self._log_gen = 0
        # reward-hacking alarms: the monitor (None with --hack-alarms off), each completed training rollout's report
        # until it is trained, and one observation at a time
        self.hack_monitor = make_monitor(self.cfg)
        self.hack_reports: dict[int, dict] = {}
        self._hack_lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------------------------------ start-up
    async def on_start(self) -> None:
        self._changed = asyncio.Condition()
        from ..data import load_prompt_data
        self.dataset, self.eval_sets = await self.run_blocking(load_prompt_data, self.cfg)
        if self.cfg.rollout.dynamic_sampling_filter_path:
            from ..filters import DynamicFilter
            self.filter_fn = DynamicFilter(self.cfg.rollout.dynamic_sampling_filter_path)
        self.state_dir = Path(self.runtime.run_dir) / "buffer"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        restored = self._restore()
        if restored == "fresh":  # what a training group with no checkpoint yet rolls back to
            self._write_snapshot(self.state_dir / "initial.msgpack")
            self._compact()
        else:
            self._log_file = open(self.state_dir / "log.msgpack", "ab")
            self.spawn(self._reconcile_leases(), name="reconcile")
        self.log.info("buffer ready", prompts=len(self.dataset) if self.dataset is not None else 0,
                      eval_sets=list(self.eval_sets), restored=restored)

    async def _reconcile_leases(self) -> None:
        """After a restart: a lease logged just before the crash may never have reached its worker. Ask each
        worker holding leases what it still has and re-issue the rest. A worker that does not answer keeps its
        leases: it may still hand them in, and if it is dead the directory's _peer_down (or its restart) releases
        them."""
        held: dict[str, set[str]] = {}
        for g in self.groups.values():
            if g.state == LEASED and g.worker and g.worker.startswith("rollout/"):
                held.setdefault(g.worker, set()).add(g.work_id)
        for worker, wids in held.items():
            try:
                has = set(await self.ask(worker, "held_groups", {}, timeout=max(10.0, self.runtime.down_after * 2)))
            except Exception as exc:
                self.log.warning("worker did not say what it holds; its leases stay", worker=worker,
                                 error=str(exc))
                continue
            n = 0
            for wid in wids - has:
                g = self.groups.get(wid)
                if g is not None and g.state == LEASED and g.worker == worker:
                    self._apply_requeue(wid, None, False)
                    self._persist("requeue", work_id=wid, samples=None, keep_partial=False)
                    n += 1
            if n:
                self.log.warning("re-issued groups a worker no longer holds", worker=worker, groups=n)
                self._notify()

    async def on_stop(self) -> None:
        if self._log_file is not None:
            self._log_file.close()

    async def on_peer_down(self, name: str, reason: str) -> None:
        if name.startswith("rollout/"):
            n = self._release(name, f"worker down: {reason}")
            if n:
                self.log.warning("re-issued a dead worker's groups", worker=name, groups=n)

    def _now(self) -> float:
        """Wall-clock time as a recorded input (wait_rollout's `seconds` depend on it; replay serves it back)."""
        if self._replaying:  # rebuilding state from the event log: nothing new comes in
            return time.time()
        return self.recorded("clock", time.time)

    # ------------------------------------------------------------------------------------------ persistence
    def _persist(self, ev: str, **data) -> None:
        if self._replaying or self._log_file is None:
            return
        self._log_file.write(msgpack.packb([ev, time.time(), data], use_bin_type=True))
        self._log_file.flush()

    def _snapshot_state(self) -> dict:
        return {"groups": [g.record() for g in self.groups.values() if g.state != TRAINED],
                "queue": {k: list(v) for k, v in self.queue.items()},
                "rollouts": {k: vars(r) for k, r in self.rollouts.items()},
                "accounts": self.accounts, "next_sample": self.next_sample, "next_group": self.next_group,
                "carried": list(self.carried),
                "weight_version": self.weight_version, "active": self.active,
                "dataset": self.dataset.state_dict() if self.dataset is not None else None,
                "stats": self.stats, "epoch": self.epoch, "discarded": self.discarded, "rollbacks": self.rollbacks,
                "log_gen": self._log_gen,
                "hack_monitor": self.hack_monitor.state_dict() if self.hack_monitor is not None else None,
                "hack_reports": self.hack_reports}

    def _load_state(self, st: dict) -> None:
        self.groups = {d["work_id"]: Group.from_record(d) for d in st["groups"]}
        self.queue = {k: deque(v) for k, v in st["queue"].items()}
        self.rollouts = {k: Rollout(**v) for k, v in st["rollouts"].items()}
        self.accounts = {int(k): v for k, v in st["accounts"].items()}
        self.carried = deque(st.get("carried", []))
        self.next_sample, self.next_group = st["next_sample"], st["next_group"]
        self.weight_version, self.active = st["weight_version"], st["active"]
        self.stats.update(st.get("stats", {}))
        if st.get("dataset") is not None and self.dataset is not None:
            self.dataset.load_state_dict(st["dataset"])
        self.epoch = st.get("epoch", 0)
        self.discarded = {int(k): v for k, v in st.get("discarded", {}).items()}
        self.rollbacks = list(st.get("rollbacks", []))
        self._log_gen = st.get("log_gen", 0)
        self._load_hack_state(st.get("hack_monitor"), st.get("hack_reports"))

    def _write_snapshot(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(msgpack.packb(self._snapshot_state(), use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _compact(self) -> None:
        """Snapshot the state and start an empty log (after each trained rollout). The log starts with the
        snapshot's generation: a crash between the two writes leaves an old log that _restore then ignores."""
        self._log_gen += 1
        self._trained_since_compact = 0
        self._write_snapshot(self.state_dir / "snapshot.msgpack")
        if self._log_file is not None:
            self._log_file.close()
        self._log_file = open(self.state_dir / "log.msgpack", "wb")
        self._log_file.write(msgpack.packb(["gen", time.time(), {"gen": self._log_gen}], use_bin_type=True))
        self._log_file.flush()

    def _restore(self) -> str:
        """Rebuild state: checkpoint (--load), else this run's snapshot + log, else fresh."""
        snap = self.state_dir / "snapshot.msgpack"
        log = self.state_dir / "log.msgpack"
        how = "fresh"
        from ..checkpoints import resolve_load
        ckpt = resolve_load(self.cfg)  # (checked by the head before the job started)
        if ckpt is not None and (ckpt / "buffer.msgpack").exists() and not snap.exists() and not log.exists():
            with open(ckpt / "buffer.msgpack", "rb") as f:
                self._load_state(msgpack.unpackb(f.read(), raw=False, strict_map_key=False))
            return f"checkpoint {ckpt}"
        if snap.exists():
            with open(snap, "rb") as f:
                self._load_state(msgpack.unpackb(f.read(), raw=False, strict_map_key=False))
            how = "snapshot"
        if log.exists() and log.stat().st_size:
            self._replaying = True
            n = 0
            try:
                up = msgpack.Unpacker(raw=False, strict_map_key=False)
                up.feed(log.read_bytes())
                for i, (ev, _t, data) in enumerate(_records(up)):
                    if ev == "gen":
                        if data["gen"] != self._log_gen:  # a log older than the snapshot: already in it
                            how += " (stale log ignored)"
                            break
                        continue
                    getattr(self, f"_apply_{ev}")(**data)
                    n += 1
            finally:
                self._replaying = False
            how += f" + {n} logged events"
        if how != "fresh":
            # groups leased at the crash stay leased: their workers may still hand them in; if those workers are
            # gone the directory's _peer_down (or their restart) releases them.
            self._wake_rollouts()
        return how

    # ------------------------------------------------------------------------------------------ state changes
    # Every change goes through an _apply_* method that is also replayed from the log.
    def _apply_start(self, rollout_id: int, kind: str, target: int, name: str, weight_version: int) -> None:
        key = f"{kind}:{rollout_id}"
        if kind == "eval":
            self.queue["eval"].clear()  # an earlier eval's unfinished groups are not needed any more
        if key not in self.rollouts:
            self.rollouts[key] = Rollout(rollout_id, kind, target, name, weight_version, started=self._now())
        self.active[kind] = rollout_id
        self.weight_version = max(self.weight_version, weight_version)
        if kind == "train":
            # queued groups left from an earlier rollout (over-sampling, returns) now belong to this one
            for wid in self.queue["train"]:
                self.groups[wid].rollout_id = rollout_id
            self._absorb_carried()

    def _apply_new_group(self, group: dict, dataset_state: dict | None) -> None:
        g = Group.from_record(group)
        self.groups[g.work_id] = g
        self.queue[g.kind].append(g.work_id)
        self.next_group = max(self.next_group, g.group_index + 1)
        for s in g.samples:
            self.next_sample = max(self.next_sample, s.index + 1)
            self.accounts.setdefault(s.index, [0, 0, 0])
        if dataset_state is not None and self.dataset is not None and g.kind == "train":
            self.dataset.load_state_dict(dataset_state)

    def _apply_lease(self, work_id: str, worker: str) -> None:
        g = self.groups[work_id]
        try:
            self.queue[g.kind].remove(work_id)
        except ValueError:
            pass
        g.state, g.worker = LEASED, worker
        g.attempts += 1
        for s in g.samples:
            self.accounts[s.index][0] += 1

    def _apply_submit(self, work_id: str, samples: list, outcome: str, error: str | None) -> None:
        g = self.groups[work_id]
        g.samples = [Sample.from_wire(s) for s in samples]
        g.state, g.error = outcome, error
        for s in g.samples:
            self.accounts[s.index][1] += 1
        r = self.rollouts.get(f"{g.kind}:{g.rollout_id}")
        if r is None:
            return
        if outcome == DONE:
            if r.done:
                # a late group of a finished rollout: it counts for the next one (unless too stale by then)
                self.carried.append(work_id)
                self._absorb_carried()
            else:
                self._complete(r, work_id)
        elif outcome == FILTERED:
            r.filtered += 1
        else:
            r.failed += 1
        if r.kind == "eval" and not r.done and len(r.completed) + r.failed >= r.target:
            r.done, r.finished = True, self._now()  # an eval is over when every prompt has an outcome

    def _complete(self, r: Rollout, work_id: str) -> None:
        r.completed.append(work_id)
        if len(r.completed) >= r.target:
            r.done, r.finished = True, self._now()

    def _absorb_carried(self) -> None:
        """Count carried-over complete groups toward the active train rollout, or regenerate stale ones."""
        rid = self.active["train"]
        r = self.rollouts.get(f"train:{rid}")
        if r is None or r.done:
            return
        while self.carried and not r.done:
            wid = self.carried.popleft()
            g = self.groups[wid]
            if self._stale(g):
                self.stats["stale_requeued"] += 1
                self._apply_requeue(wid, None, False)
                continue
            g.rollout_id = rid
            for smp in g.samples:
                smp.rollout_id = rid
            self._complete(r, wid)

    def _apply_requeue(self, work_id: str, samples: list | None, keep_partial: bool) -> None:
        g = self.groups[work_id]
        if samples is not None and keep_partial:
            g.samples = [Sample.from_wire(s) for s in samples]
        else:
            for s in g.samples:
                s.reset_response()
        g.state, g.worker = QUEUED, None
        self.queue[g.kind].appendleft(work_id)
        self.stats["requeued"] += 1

    def _apply_trained(self, rollout_id: int) -> None:
        r = self.rollouts[f"train:{rollout_id}"]
        r.trained = True
        self.hack_reports.pop(rollout_id, None)
        for wid in r.completed[: r.target]:
            g = self.groups.get(wid)
            if g is None:
                continue
            g.state = TRAINED
            for s in g.samples:
                self.accounts[s.index][2] += 1
            del self.groups[wid]  # trained samples are not kept in memory

    # ------------------------------------------------------------------------------------------ helpers
    def _sampling_params(self, kind: str) -> dict:
        ro, ev = self.cfg.rollout, self.cfg.eval
        if kind == "eval":
            sp = {"temperature": ev.eval_temperature, "top_p": ev.eval_top_p, "top_k": ev.eval_top_k,
                  "max_new_tokens": ev.eval_max_response_len}
        else:
            sp = {"temperature": ro.rollout_temperature, "top_p": ro.rollout_top_p, "top_k": ro.rollout_top_k,
                  "max_new_tokens": ro.rollout_max_response_len}
        if ro.rollout_stop:
            sp["stop"] = list(ro.rollout_stop)
        if ro.rollout_stop_token_ids:
            sp["stop_token_ids"] = list(ro.rollout_stop_token_ids)
        return sp

    def _new_groups(self, kind: str, rollout_id: int, n: int, name: str = "") -> int:
        """Create `n` groups from the dataset (train) or all of an eval set; returns how many were made."""
        a = self.cfg
        if kind == "train":
            prompts = self.dataset.next_prompts(n)
            per = a.rollout.n_samples_per_prompt
        else:
            prompts = self.eval_sets[name].all_prompts()
            per = a.eval.n_samples_per_eval_prompt
        made = 0
        for p in prompts:
            gi = self.next_group
            samples = [Sample(index=self.next_sample + j, group_index=gi, prompt=p["prompt"],
                              prompt_tokens=list(p["prompt_tokens"]), label=p.get("label"),
                              metadata=dict(p.get("metadata") or {}), rollout_id=rollout_id) for j in range(per)]
            g = Group(self._work_id(kind, gi), rollout_id, kind, gi, samples, self._sampling_params(kind))
            self._apply_new_group(g.record(), None)
            self._persist("new_group", group=g.record(),
                          dataset_state=self.dataset.state_dict() if kind == "train" else None)
            made += 1
        return made

    def _work_id(self, kind: str, group_index: int) -> str:
        # after a rollback (epoch > 0) work ids differ from every id handed out before it
        return f"{kind}-{group_index}" + (f".e{self.epoch}" if self.epoch else "")

    def _release(self, worker: str, reason: str) -> int:
        n = 0
        for g in list(self.groups.values()):
            if g.state == LEASED and g.worker == worker:
                self._apply_requeue(g.work_id, None, False)
                self._persist("requeue", work_id=g.work_id, samples=None, keep_partial=False)
                n += 1
        if n:
            self._notify()
        return n

    def _notify(self) -> None:
        async def wake():
            async with self._changed:
                self._changed.notify_all()
        if self._changed is not None:
            self.spawn(wake(), name="notify")

    def _wake_rollouts(self) -> None:
        for key, r in self.rollouts.items():
            if r.done:
                self._rollout_events.setdefault(key, asyncio.Event()).set()

    def _missing(self, kind: str) -> int:
        """Groups the active rollout still lacks beyond those queued or in flight (filtered/failed ones)."""
        rid = self.active[kind]
        if rid is None or kind == "eval":
            return 0
        r = self.rollouts[f"{kind}:{rid}"]
        if r.done:
            return 0
        in_play = len(self.queue[kind]) + sum(1 for g in self.groups.values()
                                             if g.kind == kind and g.state == LEASED)
        return max(0, r.target - len(r.completed) - in_play)

    def _stale(self, g: Group) -> bool:
        if g.kind != "train" or self.cfg.rollout.partial_rollout:
            return False
        return self._stale_samples(g.samples)

    def _stale_samples(self, samples: list[Sample]) -> bool:
        if self.cfg.rollout.partial_rollout:
            return False
        limit = self.cfg.run.max_staleness if self.cfg.run.async_train else 0
        versions = [s.weight_version for s in samples if s.weight_version >= 0]
        return bool(versions) and min(versions) < self.weight_version - limit

    # ------------------------------------------------------------------------------------------ handlers
    @handler
    async def start_rollout(self, rollout_id: int, kind: str = "train", weight_version: int = 0,
                            name: str = "") -> dict:
        if kind not in ("train", "eval"):
            raise ValueError(f"kind must be train or eval, got {kind!r}")
        key = f"{kind}:{rollout_id}"
        if key in self.rollouts:  # a retried ask, or a controller restarted mid-rollout
            return {"groups": len(self.queue[kind]), "rollout_id": rollout_id, "kind": kind, "existing": True}
        if kind == "eval":
            if name not in self.eval_sets:
                raise KeyError(f"no eval set named {name!r} (have: {', '.join(self.eval_sets) or 'none'})")
            target = len(self.eval_sets[name])
        else:
            target = self.cfg.rollout.rollout_batch_size
        self._apply_start(rollout_id, kind, target, name, weight_version)
        self._persist("start", rollout_id=rollout_id, kind=kind, target=target, name=name,
                      weight_version=weight_version)
        if kind == "train":
            r = self.rollouts[key]
            want = self.cfg.rollout.over_sampling_batch_size - len(r.completed) - len(self.queue["train"])
            made = self._new_groups("train", rollout_id, max(0, want))
        else:
            made = self._new_groups("eval", rollout_id, 0, name)
        self._notify()
        if self.rollouts[key].done:
            self._wake_rollouts()
        return {"groups": len(self.queue[kind]), "new_groups": made, "rollout_id": rollout_id, "kind": kind}

    @handler
    async def get_work(self, worker: str, max_groups: int, wait: float = 0.0) -> dict:
        clock = self.monotonic  # recorded clock readings: replay takes the same turns
        deadline = clock() + wait
        while True:
            out = self._take(worker, max_groups)
            if out or clock() >= deadline:
                return {"groups": out}
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), max(0.0, deadline - clock()))
                except asyncio.TimeoutError:
                    pass

    def _take(self, worker: str, max_groups: int) -> list[dict]:
        out = []
        for kind in ("eval", "train"):
            rid = self.active[kind]
            if rid is None:
                continue
            r = self.rollouts[f"{kind}:{rid}"]
            if r.done:
                continue
            if not self.queue[kind] and self._missing(kind):
                self._new_groups(kind, rid, self._missing(kind))
            while self.queue[kind] and len(out) < max_groups:
                wid = self.queue[kind][0]
                self._apply_lease(wid, worker)
                self._persist("lease", work_id=wid, worker=worker)
                g = self.groups[wid]
                g.rollout_id = rid
                for s in g.samples:
                    s.rollout_id = rid
                out.append(g.wire())
                self.stats["handed_out"] += 1
        return out

    @handler
    async def submit(self, worker: str, work_id: str, samples: list) -> dict:
        g = self.groups.get(work_id)
        if g is None:
            raise KeyError(f"unknown work id {work_id!r}")
        if g.state != LEASED or g.worker != worker:
            self.stats["duplicates"] += 1
            why = (f"{work_id} is {g.state}" + (f" (leased to {g.worker})" if g.state == LEASED else "")
                   + f"; {worker}'s submission is refused")
            self.log.warning("submission refused", work_id=work_id, worker=worker, reason=why)
            return {"accepted": False, "reason": why}
        if len(samples) != len(g.samples):
            raise ValueError(f"{work_id}: expected {len(g.samples)} samples, got {len(samples)}")
        parsed = [Sample.from_wire(s) for s in samples]
        for old, new in zip(g.samples, parsed):
            if old.index != new.index:
                raise ValueError(f"{work_id}: sample index {new.index} does not belong to this group "
                                 f"(expected {old.index})")
            if len(new.loss_mask) != len(new.response_tokens) or \
                    len(new.rollout_log_probs) != len(new.response_tokens):
                raise ValueError(f"{work_id}: sample {new.index} has {len(new.response_tokens)} response tokens "
                                 f"but {len(new.loss_mask)} loss-mask entries and {len(new.rollout_log_probs)} "
                                 "log-probs")
        error = None
        if any(s.status == FAILED or (s.reward is None and g.kind == "train") for s in parsed):
            outcome = GROUP_FAILED
            error = "; ".join(f"sample {s.index}: {s.error or 'no reward'}" for s in parsed
                              if s.status == FAILED or s.reward is None)[:2000]
        elif g.kind == "train" and self.filter_fn is not None and not self.filter_fn(self.plugin_args, parsed):
            outcome = FILTERED
        else:
            outcome = DONE
        if outcome == DONE and g.kind == "train" and self._stale_samples(parsed):
            # generated at an older weight version than this rollout allows (an engine that served before its
            # re-sync): not trained on; generated again
            self.stats["stale_requeued"] += 1
            self._apply_requeue(work_id, None, False)
            self._persist("requeue", work_id=work_id, samples=None, keep_partial=False)
            self.log.warning("stale group regenerated", work_id=work_id, worker=worker,
                             versions=sorted({s.weight_version for s in parsed}), current=self.weight_version)
            self._notify()
            return {"accepted": False, "reason": "stale weight version; regenerated"}
        self._apply_submit(work_id, [s.to_wire() for s in parsed], outcome, error)
        self._persist("submit", work_id=work_id, samples=[s.to_wire() for s in parsed], outcome=outcome,
                      error=error)
        self.stats["submitted"] += 1
        if outcome == GROUP_FAILED:
            self.log.warning("group failed", work_id=work_id, error=error)
        r = self.rollouts.get(f"{g.kind}:{g.rollout_id}")
        if r is not None and r.done:
            self._rollout_events.setdefault(f"{g.kind}:{g.rollout_id}", asyncio.Event()).set()
        self._notify()
        return {"accepted": True, "outcome": outcome}

    @handler
    async def return_work(self, worker: str, work_id: str, samples: list | None = None,
                          reason: str = "") -> dict:
        g = self.groups.get(work_id)
        if g is None or g.state != LEASED or g.worker != worker:
            return {"requeued": False, "reason": f"{work_id} is not leased to {worker}"}
        keep = bool(self.cfg.rollout.partial_rollout and samples)
        if samples is not None and keep:
            for s in samples:
                if s.get("status") not in (ABORTED, PENDING, COMPLETED, TRUNCATED):
                    s["status"] = ABORTED
        self._apply_requeue(work_id, samples, keep)
        self._persist("requeue", work_id=work_id, samples=samples if keep else None, keep_partial=keep)
        self._notify()
        return {"requeued": True, "partial": keep}

    @handler
    async def release_worker(self, worker: str, reason: str = "") -> dict:
        n = self._release(worker, reason)
        if n:
            self.log.warning("released a worker's groups", worker=worker, groups=n, reason=reason)
        return {"requeued": n}

    @handler
    async def wait_rollout(self, rollout_id: int, kind: str = "train", timeout: float = 3600.0) -> dict:
        key = f"{kind}:{rollout_id}"
        if key not in self.rollouts:
            raise KeyError(f"rollout {key} was never started")
        ev = self._rollout_events.setdefault(key, asyncio.Event())
        if self.rollouts[key].done:
            ev.set()
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        stats = self._rollout_stats(key)
        r = self.rollouts[key]
        if r.kind == "train" and r.done and self.hack_monitor is not None:
            hack = await self._observe_hack(r)
            if hack is not None:
                stats["hack"] = hack
        return stats

    # ------------------------------------------------------------------------------------------ hacking alarms
    async def _observe_hack(self, r: Rollout) -> dict | None:
        """The hacking monitor's report of a completed training rollout, computed once (in a thread: a large
        rollout's text takes a while) and kept until the rollout is trained; None once it is trained and the
        report is gone. Every scored sample counts: the groups trained on and the ones the filter dropped."""
        if self._hack_lock is None:
            self._hack_lock = asyncio.Lock()
        async with self._hack_lock:
            if r.rollout_id in self.hack_reports or r.trained:
                return self.hack_reports.get(r.rollout_id)
            samples = [s for wid in r.completed[: r.target] for s in self.groups[wid].samples]
            samples += [s for g in self.groups.values() if g.kind == "train" and g.state == FILTERED
                        and g.rollout_id == r.rollout_id for s in g.samples]
            # observed on a copy: a snapshot taken meanwhile (save, compaction) reads a state that is whole
            monitor, epoch = self.hack_monitor, self.epoch
            work = make_monitor(self.cfg)
            work.load_state_dict(monitor.state_dict())
            try:
                report = report_wire(await self.run_blocking(work.observe, r.rollout_id, samples))
                state = work.state_dict()
            except Exception as exc:  # the monitor must never stop training: the controller warns
                self.log.warning("hack monitor failed", rollout_id=r.rollout_id, error=repr(exc))
                report, state = failed_wire(r.rollout_id, exc), monitor.state_dict()
            if epoch != self.epoch or monitor is not self.hack_monitor:
                return None  # rolled back meanwhile: this rollout's samples and the monitor's state are gone
            self._apply_hack(r.rollout_id, report, state)
            self._persist("hack", rollout_id=r.rollout_id, report=report, monitor=state)
            return report

    def _apply_hack(self, rollout_id: int, report: dict, monitor: dict | None) -> None:
        self.hack_reports[rollout_id] = report
        if self.hack_monitor is not None and monitor is not None:
            self.hack_monitor.load_state_dict(monitor)

    def _load_hack_state(self, monitor: dict | None, reports: dict | None) -> None:
        """The monitor's state as a snapshot or checkpoint holds it (a fresh monitor when it holds none: one
        written with --hack-alarms off, or before the monitor existed)."""
        self.hack_reports = {int(k): v for k, v in (reports or {}).items()}
        if self.hack_monitor is None:
            return
        fresh = make_monitor(self.cfg)
        if monitor is not None:
            try:
                fresh.load_state_dict(monitor)
            except ValueError as exc:
                self.log.warning("hack monitor state unreadable; starting it afresh", error=str(exc))
        self.hack_monitor = fresh

    def _rollout_stats(self, key: str) -> dict:
        r = self.rollouts[key]
        samples = [s for wid in r.completed[: r.target] for s in self.groups[wid].samples] \
            if not r.trained else []
        rewards = [s.reward for s in samples if s.reward is not None]
        lengths = [s.response_length for s in samples]
        return {"complete": r.done, "rollout_id": r.rollout_id, "kind": r.kind, "groups": len(r.completed),
                "target": r.target, "samples": len(samples), "filtered": r.filtered, "failed": r.failed,
                "reward_mean": sum(rewards) / len(rewards) if rewards else None,
                "response_len_mean": sum(lengths) / len(lengths) if lengths else None,
                "truncated": sum(1 for s in samples if s.status == TRUNCATED),
                "reward_timeouts": sum(1 for s in samples if s.metadata.get("reward_timed_out")),
                "examples": pick_examples(samples),   # the best and the worst of one group, for people to read
                "seconds": (r.finished or self._now()) - r.started,
                "weight_versions": sorted({s.weight_version for s in samples}),
                "weight_version_min": min((s.weight_version for s in samples), default=-1),
                "passrate": self._passrate(r) if self.cfg.logging.log_passrate and not r.trained else {}}

    def _passrate(self, r) -> dict:
        """--log-passrate: pass@k over the rollout's groups (algo/passrate.py)."""
        from ..algo.passrate import pass_at_k
        return pass_at_k([[s.reward for s in self.groups[wid].samples] for wid in r.completed[: r.target]])

    @handler
    async def get_batch(self, rollout_id: int, rank: int, world_size: int) -> dict:
        r = self.rollouts.get(f"train:{rollout_id}")
        if r is None or not r.done:
            raise RuntimeError(f"rollout {rollout_id} is not complete")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        # whole groups, in group order (not completion order) so a rerun or a resumed run trains identically
        wids = sorted(r.completed[: r.target], key=lambda w: self.groups[w].group_index)[rank::world_size]
        samples = [s for wid in wids for s in self.groups[wid].samples]
        return batch_from_samples(samples)

    @handler
    async def mark_trained(self, rollout_id: int) -> None:
        r = self.rollouts.get(f"train:{rollout_id}")
        if r is None or not r.done:
            raise RuntimeError(f"rollout {rollout_id} is not complete; it cannot have been trained")
        if r.trained:
            return
        self._apply_trained(rollout_id)
        self._persist("trained", rollout_id=rollout_id)
        # the log is replayed on a restart; folding it into a new snapshot (packing the state, an fsync) costs
        # milliseconds a step, so it happens every COMPACT_EVERY trained rollouts, or once the log is large
        self._trained_since_compact += 1
        if self._trained_since_compact >= COMPACT_EVERY or (
                self._log_file is not None and self._log_file.tell() > COMPACT_LOG_BYTES):
            self._compact()

    @handler
    def accounting(self) -> dict:
        counts = {"issued": 0, "trained_once": 0, "trained_more": 0, "untrained": 0}
        multi = []
        for idx, (issued, submitted, trained) in self.accounts.items():
            counts["issued"] += 1
            if trained == 1:
                counts["trained_once"] += 1
            elif trained > 1:
                counts["trained_more"] += 1
                multi.append(idx)
            else:
                counts["untrained"] += 1
        trained_rollouts = sorted(r.rollout_id for r in self.rollouts.values() if r.kind == "train" and r.trained)
        pending = sorted(g.work_id for g in self.groups.values() if g.state in (QUEUED, LEASED))
        # a sample never trained must still be somewhere: queued, leased, done (waiting for a rollout), filtered or
        # failed (recorded with its reason); one that is nowhere was lost
        where = {s.index: g.state for g in self.groups.values() for s in g.samples}
        lost = [idx for idx, (_i, _s, trained) in self.accounts.items() if trained == 0 and idx not in where]
        by_state: dict[str, int] = {}
        for idx, (_i, _s, trained) in self.accounts.items():
            if trained == 0 and idx in where:
                by_state[where[idx]] = by_state.get(where[idx], 0) + 1
        return {**counts, "duplicated": multi[:100], "trained_rollouts": trained_rollouts,
                "pending_groups": pending[:100], "stats": dict(self.stats),
                "expected_trained": len(trained_rollouts) * self.cfg.rollout.rollout_batch_size
                * self.cfg.rollout.n_samples_per_prompt,
                "lost": len(lost), "lost_samples": lost[:100], "untrained_by_state": by_state,
                # trainings that went into weights a trainer-group restart threw away (the samples were then
                # trained again, once, by the restored weights: see rollback)
                "discarded": {"samples": len(self.discarded), "trainings": sum(self.discarded.values())},
                "rollbacks": [r["result"] for r in self.rollbacks], "epoch": self.epoch}

    @handler
    async def save(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        data = msgpack.packb(self._snapshot_state(), use_bin_type=True)  # on the loop: state does not move

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
        by the restored weights; `accounting` reports the discarded trainings. Idempotent per `token`."""
        if token and self.rollbacks and self.rollbacks[-1].get("token") == token:
            return self.rollbacks[-1]["result"]
        ahead = sorted(r.rollout_id for r in self.rollouts.values() if r.kind == "train"
                       and r.rollout_id >= if_ahead_of)
        fresh = not self.rollouts and not self.groups
        if not ahead and not (fresh and path):
            return {"rolled_back": False, "reason": f"no rollout from {if_ahead_of} on"}
        src = Path(path) / "buffer.msgpack" if path else self.state_dir / "initial.msgpack"
        if not src.exists():
            if fresh:
                return {"rolled_back": False, "reason": f"no buffer snapshot at {src}; starting fresh"}
            raise FileNotFoundError(f"rollback: no buffer snapshot at {src}")
        st = await self.run_blocking(lambda: msgpack.unpackb(src.read_bytes(), raw=False, strict_map_key=False))
        trained_before = {idx: acc[2] for idx, acc in self.accounts.items()}
        trained_ahead = sorted(r.rollout_id for r in self.rollouts.values() if r.kind == "train" and r.trained
                               and r.rollout_id >= if_ahead_of)
        for ev in self._rollout_events.values():  # wake stale waiters; their askers are gone
            ev.set()
        self._rollout_events.clear()
        keep = (self.epoch, self.discarded, self.rollbacks, self._log_gen, dict(self.stats))
        self._load_state(st)
        self.epoch, self.discarded, self.rollbacks, gen, self.stats = keep
        self._log_gen = max(gen, self._log_gen)
        n_discarded = 0
        for idx, tr in trained_before.items():
            kept = self.accounts.get(idx, [0, 0, 0])[2]
            if tr > kept:
                self.discarded[idx] = self.discarded.get(idx, 0) + tr - kept
                n_discarded += tr - kept
        self.epoch += 1
        # new work ids for every group: a late submission of work handed out before the rollback cannot match
        rename = {}
        for g in self.groups.values():
            rename[g.work_id] = self._work_id(g.kind, g.group_index)
            g.work_id = rename[g.work_id]
        self.groups = {g.work_id: g for g in self.groups.values()}
        for kind, q in self.queue.items():
            self.queue[kind] = deque(rename.get(w, w) for w in q)
        for r in self.rollouts.values():
            r.completed = [rename.get(w, w) for w in r.completed]
        self.carried = deque(rename.get(w, w) for w in self.carried)
        for g in self.groups.values():  # what was leased at the checkpoint is void now
            if g.state == LEASED:
                self._apply_requeue(g.work_id, None, False)
        result = {"rolled_back": True, "to": str(src), "if_ahead_of": if_ahead_of,
                  "trained_rollouts_discarded": trained_ahead, "samples_discarded": n_discarded,
                  "epoch": self.epoch, "reason": reason}
        self.rollbacks.append({"time": self._now(), "token": token, "result": result})
        self._compact()
        self._wake_rollouts()
        self._notify()
        self.log.warning("rolled back to a checkpoint", **{k: v for k, v in result.items() if k != "rolled_back"})
        return result

    @handler
    def eval_results(self, rollout_id: int) -> list:
        r = self.rollouts.get(f"eval:{rollout_id}")
        if r is None:
            raise KeyError(f"no eval {rollout_id}")
        return [{"index": s.index, "prompt": s.prompt, "response": s.response, "reward": s.reward,
                 "label": s.label} for wid in r.completed for s in self.groups[wid].samples]

    @handler
    def dump_rollout(self, rollout_id: int) -> list:
        r = self.rollouts.get(f"train:{rollout_id}")
        if r is None or not r.done:
            raise RuntimeError(f"rollout {rollout_id} is not complete")
        return [s.to_wire() for wid in r.completed[: r.target] for s in self.groups[wid].samples]

    @handler
    async def load_rollout(self, rollout_id: int, samples: list) -> dict:
        """Insert recorded samples as a complete rollout (training from saved rollouts, no engine)."""
        parsed = [Sample.from_wire(s) for s in samples]
        by_group: dict[int, list[Sample]] = {}
        for s in parsed:
            by_group.setdefault(s.group_index, []).append(s)
        key = f"train:{rollout_id}"
        if key in self.rollouts:
            return {"groups": len(self.rollouts[key].completed)}
        self._apply_start(rollout_id, "train", len(by_group), "loaded", self.weight_version)
        self._persist("start", rollout_id=rollout_id, kind="train", target=len(by_group), name="loaded",
                      weight_version=self.weight_version)
        for gi, ss in by_group.items():
            gid = f"loaded-{rollout_id}-{gi}"
            g = Group(gid, rollout_id, "train", gi, ss, {}, QUEUED)
            self._apply_new_group(g.record(), None)
            self._persist("new_group", group=g.record(), dataset_state=None)
            self._apply_lease(gid, "loaded")
            self._persist("lease", work_id=gid, worker="loaded")
            self._apply_submit(gid, [s.to_wire() for s in ss], DONE, None)
            self._persist("submit", work_id=gid, samples=[s.to_wire() for s in ss], outcome=DONE, error=None)
        self._wake_rollouts()
        return {"groups": len(by_group)}


def _records(up):
    while True:
        try:
            rec = up.unpack()
        except msgpack.OutOfData:
            return  # a record cut short by a crash: everything before it is intact
        yield rec
