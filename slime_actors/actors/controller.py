"""The controller: the step schedule, evaluation, weight-sync cadence and checkpoints.

Synchronous mode, one step k:
    buffer.start_rollout(k) -> rollout workers resume -> buffer.wait_rollout(k) -> workers end_rollout (abort the
    rest, return it) -> every trainer rank train(k) -> buffer.mark_trained(k) -> trainer/0 sync_weights(v+1)
One-step-off asynchronous mode (--async-train): rollout k+1 is started as soon as rollout k is complete and is
generated while the trainers train on k; samples are at most --max-staleness weight versions old (the buffer
regenerates older ones). Engines are paused for the weight update only.

It also re-syncs an engine that (re)starts at an old weight version before that engine serves again, evaluates
every --eval-interval steps, saves checkpoints every --save-interval steps, and writes metrics (JSONL, TensorBoard
and W&B through slime_actors.metric_sinks, a PNG of the reward and eval curves). The buffer's reward-hacking monitor
reports on every training rollout (stats["hack"]); `_hack_alarms` logs its hack/* metrics with the step's, writes
each tripped alarm to RUN_DIR/alarms.jsonl with a warning, and with --hack-alarms stop ends the run after that step,
with a checkpoint.

Faults (docs/fault-tolerance.md). The trainer ranks form their process group through the controller
(`trainer_join`: a rendezvous with a generation number and the checkpoint to load). When a rank dies -- an ask to
it fails, the directory declares it down, or it joins again after a restart -- the group of that generation is
broken: the controller tells its members to leave (`abort_group`), ends the rollout in flight, rolls the buffer
back to the last checkpoint (`rollback`: rollouts trained after it are trained again, once, by the restored
weights; accounting reports what was discarded), waits for the new generation to load that checkpoint, re-syncs
every engine to its weights and carries on from its rollout id. Asks to the buffer are retried while it restarts.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path

from ..checkpoints import hf_export_due, hf_export_path, latest_checkpoint, read_meta, resolve_load
from ..config import JobConfig, RunSection, debug_rollout_path
from ..log import CONSOLE, console_write, progress_line
from ..mailbox.errors import AskTimeout, MailboxError, PeerDown, RemoteError, UnknownPeer
from ..monitor.alarms import record_hack_alarms, stop_reason, trim_alarms
from ..samples import EVAL_DIR
from .base import Actor, handler


MAX_GROUP_RESTARTS = 5  # training group restarts within 600 s before the job gives up


class TrainerGroupFailed(RuntimeError):
    """A trainer rank failed; `confirmed` when a rank is known dead (not just an error one of them raised)."""

    def __init__(self, reason: str, confirmed: bool):
        super().__init__(reason)
        self.confirmed = confirmed


class _Rendezvous:
    """One generation of the training group: who joined (rank -> address, port, pid), when it formed, who is ready."""

    def __init__(self, generation: int, world: int):
        self.generation, self.world = generation, world
        self.joined: dict[int, dict] = {}
        self.formed = asyncio.get_running_loop().create_future()
        self.ready: set[int] = set()
        self.all_ready = asyncio.Event()
        self.broken = False


class Controller(Actor):
    role = "controller"

    def __init__(self, index: int = 0, resume_from_save: bool = False, **config):
        """`resume_from_save`: a restarted job (torchrun) resumes from the newest checkpoint under --save."""
        super().__init__(index, resume_from_save=resume_from_save, **config)
        self.resume_from_save = resume_from_save
        self.cfg = JobConfig.from_dict(config["args"])
        self.rollouts = [f"rollout/{i}" for i in range(self.cfg.engine.rollout_num_engines)]
        self.trainers = [f"trainer/{i}" for i in range(self.cfg.train.n_ranks)]
        self.version = 0
        self.rollout_id = 0
        self.phase = "starting"
        self.engine_versions: dict[str, int] = {}
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.done: asyncio.Future | None = None
        self._sync_lock: asyncio.Lock | None = None
        self._resync_tasks: dict[str, asyncio.Task] = {}
        self.metrics_file = None
        self.sinks = None                   # TensorBoard and W&B (slime_actors.metric_sinks)
        self._rows_before_start = 0  # metrics rows of the run before this job resumed it
        self.result: dict = {}
        self._rdzv: _Rendezvous | None = None
        self._fail: asyncio.Future | None = None
        self._ckpt: Path | None = None      # the checkpoint a (re)started training group loads
        self._initial_rng = random.getstate()
        self.recoveries: list[dict] = []
        self.accounting: dict | None = None
        self._pending: asyncio.Future | None = None  # async mode: the next rollout, generated while training
        self._fresh_engines: set[str] = set()  # engines (re)started since their last weight sync
        self._failed_generation: int | None = None
        self.last_examples: dict | None = None   # the last rollout's best and worst sample (printed at the end)
        self.stopped: dict | None = None   # why the run ended before --num-rollout (--hack-alarms stop)

    async def on_start(self) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self._sync_lock = asyncio.Lock()
        self.metrics_path = Path(self.runtime.run_dir) / "metrics.jsonl"
        self._ckpt = self._initial_checkpoint()
        self._rdzv = _Rendezvous(0, len(self.trainers))
        self._fail = asyncio.get_running_loop().create_future()
        self.spawn(self._run(), name="loop")

    def _initial_checkpoint(self) -> Path | None:
        save = self.cfg.checkpoint.save
        if self.resume_from_save and save:  # a restarted job (torchrun)
            ckpt = latest_checkpoint(save)
            if ckpt is not None:
                return ckpt
        return resolve_load(self.cfg)  # (the head checked --load before the job started: this does not raise)

    # ------------------------------------------------------------------------------------------ training group
    @handler
    async def trainer_join(self, rank: int, world_size: int, addr: str, port: int, pid: int) -> dict:
        """A trainer rank joins the training group; answered when every rank of this generation has joined."""
        if world_size != len(self.trainers) or not 0 <= rank < world_size:
            raise ValueError(f"trainer rank {rank} of world size {world_size} does not fit this job's "
                             f"{len(self.trainers)} trainer rank(s)")
        rd = self._rdzv
        if rd.formed.done():  # a member joins again: it restarted, so the group it was part of is broken
            self._trainer_failure(f"trainer/{rank} restarted (pid {pid}) and joined again")
            rd = self._next_generation()
        rd.joined[rank] = {"addr": addr, "port": port, "pid": pid}
        self.log.info("trainer joined", rank=rank, generation=rd.generation, joined=len(rd.joined), of=rd.world)
        if len(rd.joined) == rd.world and not rd.formed.done():
            if 0 not in rd.joined or not rd.joined[0]["port"]:
                raise ValueError("trainer rank 0 did not offer a port for the group's store")
            m = rd.joined[0]
            rd.formed.set_result({"master_addr": m["addr"], "master_port": m["port"], "generation": rd.generation,
                                  "checkpoint": str(self._ckpt) if self._ckpt else None})
        return await asyncio.shield(rd.formed)

    @handler
    def trainer_ready(self, rank: int, generation: int, weight_version: int = 0) -> None:
        rd = self._rdzv
        if generation != rd.generation:
            return
        rd.ready.add(rank)
        if len(rd.ready) == rd.world:
            rd.all_ready.set()

    def _next_generation(self) -> _Rendezvous:
        if not self._rdzv.formed.done():
            return self._rdzv
        self._rdzv.broken = True
        self._rdzv = _Rendezvous(self._rdzv.generation + 1, len(self.trainers))
        return self._rdzv

    def _trainer_failure(self, reason: str) -> None:
        rd = self._rdzv
        if rd.broken or not rd.formed.done():
            return
        self.log.error("training group failed", generation=rd.generation, reason=reason)
        if self._fail is not None and not self._fail.done():
            self._failed_generation = rd.generation
            self._fail.set_result(reason)

    async def on_peer_down(self, name: str, reason: str) -> None:
        if name in self.trainers:
            self._trainer_failure(f"{name} is down ({reason})")

    async def _ask_trainers(self, method: str, body: dict, timeout: float, who: list[str] | None = None) -> list:
        """Ask trainer ranks at once; any failure is a TrainerGroupFailed (confirmed when a rank is gone)."""
        tasks = [asyncio.ensure_future(self.ask(t, method, body, timeout=timeout)) for t in (who or self.trainers)]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in tasks:
                if t.done() and t.exception() is not None:
                    exc = t.exception()
                    gone = isinstance(exc, (PeerDown, AskTimeout, UnknownPeer)) or (
                        isinstance(exc, RemoteError) and exc.type == "MailboxError")
                    raise TrainerGroupFailed(f"{method}: {exc}", confirmed=gone) from exc
            return [t.result() for t in tasks]
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()

    async def _sync_weights(self, version: int, workers: list[str]) -> dict:
        """Every rank takes part (gathering weights is a collective under FSDP/Megatron); rank 0 sends. A
        (re)started engine was in no broadcast group yet: rank 0 builds a new one."""
        rebuild = bool(self._fresh_engines & set(workers))
        res = await self._ask_trainers("sync_weights", {"weight_version": version, "workers": workers,
                                                        "rebuild": rebuild}, 1800)
        self._fresh_engines -= set(workers)
        return res[0]

    # ------------------------------------------------------------------------------------------ the buffer
    async def _ask_buffer(self, method: str, body: dict | None = None, timeout: float = 300.0,
                          retry_for: float = 600.0):
        """An ask to the buffer, retried while it restarts (every buffer method the controller uses is
        idempotent: a retry of one that was applied changes nothing)."""
        t0 = None  # from the first failure (recorded clock readings: replay takes the same turns)
        attempt = 0
        while True:
            try:
                return await self.ask("buffer/0", method, body or {}, timeout=timeout)
            except MailboxError as exc:
                if isinstance(exc, RemoteError) and exc.type != "MailboxError":
                    raise
                if t0 is None:
                    t0 = self.monotonic()
                elif self.monotonic() - t0 > retry_for:
                    raise
                err = exc
            attempt += 1
            self.log.warning("buffer unavailable; retrying", method=method, error=str(err), attempt=attempt)
            await asyncio.sleep(min(2.0, 0.2 * 2 ** attempt))

    # ------------------------------------------------------------------------------------------ messages
    @handler
    async def engine_ready(self, worker: str, weight_version: int) -> None:
        """An engine (re)started: bring it to the current weights, then let it work if a rollout is running."""
        self.engine_versions[worker] = weight_version
        self._fresh_engines.add(worker)
        if self.phase in ("starting", "recovering"):
            return  # the start-up sync (or the one after a trainer-group restart) covers it
        prev = self._resync_tasks.get(worker)
        if prev is not None and not prev.done():
            prev.cancel()
        self._resync_tasks[worker] = self.spawn(self._resync(worker), name=f"resync:{worker}")

    async def _resync(self, worker: str) -> None:
        for attempt in range(3):
            try:
                async with self._sync_lock:
                    if self.engine_versions.get(worker) != self.version:
                        self.log.info("re-syncing a restarted engine", worker=worker, to_version=self.version)
                        await self._sync_weights(self.version, [worker])
                        self.engine_versions[worker] = self.version
                break
            except TrainerGroupFailed as exc:
                if exc.confirmed:
                    self._trainer_failure(str(exc))
                    return
                self.log.warning("re-sync failed; retrying", worker=worker, error=str(exc), attempt=attempt)
                self._fresh_engines.add(worker)
                await asyncio.sleep(1.0 + attempt)
        else:
            self.log.error("could not re-sync a restarted engine; stopping the job", worker=worker)
            if not self.done.done():
                self.done.set_exception(RuntimeError(f"could not re-sync the restarted engine of {worker}"))
            return
        if self.phase in ("rollout", "eval"):
            await self.tell(worker, "resume", {"weight_version": self.version})

    @handler
    def status(self) -> dict:
        return {"phase": self.phase, "rollout_id": self.rollout_id, "weight_version": self.version,
                "engines": self.engine_versions, "last": self.history[-1] if self.history else None,
                "steps": len(self.history), "num_rollout": self.cfg.run.num_rollout,
                "trainer_generation": self._rdzv.generation if self._rdzv else None,
                "recoveries": self.recoveries, "stopped": self.stopped}

    # ------------------------------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        try:
            resume: int | None = None
            while True:
                task = asyncio.ensure_future(self._loop(resume))
                await asyncio.wait({task, self._fail}, return_when=asyncio.FIRST_COMPLETED)
                if task.done() and self._fail.done() is False:
                    exc = task.exception()
                    if exc is None:
                        break
                    reason = await self._failure_reason(exc)
                    if reason is None:
                        raise exc
                else:
                    reason = self._fail.result()
                    task.cancel()
                    try:
                        await task
                    except BaseException:  # cancelled, or the failure itself
                        pass
                if self._pending is not None:
                    self._pending.cancel()
                resume = await self._recover(reason)
            self.done.set_result(self.result)
        except Exception as exc:
            self.log.error("training loop failed", error=repr(exc))
            if not self.done.done():
                self.done.set_exception(exc)

    async def _failure_reason(self, exc: BaseException) -> str | None:
        """A trainer error is a group failure when a rank is gone; an error the ranks raised while all are alive
        (a bug, a bad batch) is not retried. A survivor's collective fails before the directory notices the dead
        rank, so wait for the confirmation a little."""
        if not isinstance(exc, TrainerGroupFailed):
            return None
        if exc.confirmed:
            self._trainer_failure(str(exc))
            return str(exc)
        try:
            return await asyncio.wait_for(asyncio.shield(self._fail), 2 * self.runtime.down_after + 5)
        except asyncio.TimeoutError:
            return None

    async def _recover(self, reason: str) -> int:
        """Restart the training group from the last checkpoint; returns the rollout id to carry on from."""
        t0 = time.monotonic()
        # (a rank that restarted may have opened the next generation already: tell the failed one to leave)
        failed = self._failed_generation if self._failed_generation is not None else self._rdzv.generation
        self._failed_generation = None
        now = self.wall_time()
        rec = {"time": now, "reason": reason, "failed_at_rollout": self.rollout_id,
               "failed_generation": failed}
        window = [r for r in self.recoveries if now - r["time"] < 600]
        limit = MAX_GROUP_RESTARTS
        if len(window) >= limit:
            raise RuntimeError(f"the training group failed {len(window) + 1} times within 600 s (limit {limit}); "
                               f"last: {reason}")
        self.phase = "recovering"
        if self._rdzv.generation == failed:
            self._next_generation()  # the restarted ranks rendezvous in a new generation
        # else a restarted rank has opened the next generation already (trainer_join), and its ranks may have formed
        # it and be loading the checkpoint: opening yet another would leave them, and this wait, in different ones
        self._fail = asyncio.get_running_loop().create_future()
        self.log.error("restarting the training group from the last checkpoint", reason=reason,
                       checkpoint=str(self._ckpt) if self._ckpt else "none (initial weights)")
        # survivors leave the broken group (exit 75); their supervisor restarts them
        await asyncio.gather(*(self._quiet(self.tell(t, "abort_group", {"generation": failed, "reason": reason}))
                               for t in self.trainers))
        await self._end_rollout(self.rollout_id)
        start, self.version = self._restore_state(self._ckpt)
        rb = await self._ask_buffer("rollback", {"path": str(self._ckpt) if self._ckpt else None,
                                                 "if_ahead_of": start, "reason": reason,
                                                 "token": f"recovery-{len(self.recoveries)}-{failed}"},
                                    timeout=600)
        self.history = [h for h in self.history if h["rollout_id"] < start]
        trim_alarms(self.runtime.run_dir, before=start)
        for w in list(self.engine_versions):
            self.engine_versions[w] = -1  # every engine gets the restored weights before it serves again
        rec.update(resumed_from=start, weight_version=self.version, checkpoint=str(self._ckpt) if self._ckpt else None,
                   buffer=rb, prepare_seconds=round(time.monotonic() - t0, 3))
        self.recoveries.append(rec)
        self._write_recovery(rec)
        return start

    def _restore_state(self, ckpt: Path | None) -> tuple[int, int]:
        """(first rollout id, weight version) of a checkpoint -- or of the run's start -- and its RNG and evals."""
        if ckpt is None:
            random.setstate(self._initial_rng)
            self.evals = [e for e in self.evals if e["step"] <= (self.cfg.run.start_rollout_id or 0)]
            return self.cfg.run.start_rollout_id or 0, 0
        meta = read_meta(ckpt)
        random.setstate(_tuple_state(meta["controller_rng"]))
        self.evals = meta.get("evals", [])
        return meta["next_rollout_id"], meta["weight_version"]

    def _write_recovery(self, rec: dict) -> None:
        with open(Path(self.runtime.run_dir) / "recoveries.jsonl", "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")

    async def _trainers_ready(self, timeout: float = 1800.0) -> None:
        rd = self._rdzv
        try:
            await asyncio.wait_for(rd.all_ready.wait(), timeout)
        except asyncio.TimeoutError:
            missing = sorted(set(range(rd.world)) - rd.ready)
            raise TimeoutError(f"trainer ranks {missing} did not join and load within {timeout:.0f}s "
                               f"(generation {rd.generation})") from None

    async def _wait_for(self, names: list[str], timeout: float = 900.0) -> None:
        t0 = None
        while True:
            listing = await self.ask("directory/0", "list", timeout=30)
            missing = [n for n in names if not listing.get(n, {}).get("alive")]
            if not missing:
                return
            if t0 is None:
                t0 = self.monotonic()
            elif self.monotonic() - t0 > timeout:
                raise TimeoutError(f"actors did not come up within {timeout:.0f}s: {', '.join(missing)}")
            await asyncio.sleep(0.2)

    async def _loop(self, resume: int | None = None) -> None:
        a = self.cfg
        dbg = a.debug
        if resume is None:
            need = ["buffer/0"] + self.trainers
            if not dbg.debug_train_only:
                need += self.rollouts + [f"reward/{i}" for i in range(a.reward.num_reward_workers)]
            self.log.info("waiting for actors", actors=len(need))
            await self._wait_for(need)
            start = a.run.start_rollout_id or 0
            ckpt = self._ckpt
            if ckpt is not None:
                start, self.version = self._restore_state(ckpt)
                self.log.info("resuming", checkpoint=str(ckpt), next_rollout=start, weight_version=self.version)
            # a restarted job (torchrun) finds the buffer ahead of the checkpoint: bring it back (a no-op otherwise);
            # the token names this controller process (a recorded input: replay sends the recorded one)
            token = self.recorded("start_token", lambda: f"start-{os.getpid()}-{self.started_at}")
            rb = await self._ask_buffer("rollback", {"path": str(ckpt) if ckpt else None, "if_ahead_of": start,
                                                     "reason": "job start", "token": token})
            if rb.get("rolled_back"):
                self.log.warning("buffer rolled back to the checkpoint", **{k: v for k, v in rb.items()
                                                                            if k != "rolled_back"})
            await self._trainers_ready()
            if not dbg.debug_train_only:
                await self._startup_sync()
            await self._open_metrics(resume_at=start if ckpt is not None else None)
            if a.eval.eval_prompt_data and not a.eval.skip_eval_before_train and not dbg.debug_train_only \
                    and ckpt is None:
                await self._evaluate(start)
        else:  # after a training-group restart: the new generation loads the checkpoint; engines get its weights
            start = resume
            t0 = time.monotonic()
            await self._trainers_ready()
            rec = self.recoveries[-1]
            rec["trainers_ready_seconds"] = round(time.monotonic() - t0, 3)
            if not dbg.debug_train_only:
                await self._startup_sync()
            rec["resumed_seconds"] = round(time.monotonic() - t0 + rec["prepare_seconds"], 3)
            self.log.info("training group restarted", generation=self._rdzv.generation, resume_from=start,
                          seconds=rec["resumed_seconds"])
        progress = _progress(a.run, start)
        pending_rollout: asyncio.Task | None = None
        for k in range(start, a.run.num_rollout):
            self.rollout_id = k
            t_step = time.monotonic()
            step: dict = {"rollout_id": k, "weight_version": self.version}
            # ---- rollout
            if dbg.load_debug_rollout_data:
                stats = await self._load_debug_rollout(k)
                t_roll = 0.0
            elif a.run.async_train and pending_rollout is not None:
                stats, t_roll = await pending_rollout
            else:
                stats, t_roll = await self._rollout(k)
            step.update({f"rollout/{key}": v for key, v in stats.items() if isinstance(v, (int, float))
                         and not isinstance(v, bool)})
            step.update({f"passrate/{key}": v for key, v in (stats.get("passrate") or {}).items()})  # --log-passrate
            step["time/rollout"] = t_roll
            self._show_samples(k, stats.get("examples"))
            stopping = self._hack_alarms(k, stats, step)
            if dbg.save_debug_rollout_data:
                await self._save_debug_rollout(k)
            if dbg.debug_rollout_only:
                await self._ask_buffer("mark_trained", {"rollout_id": k})
            else:
                if a.run.async_train and k + 1 < a.run.num_rollout and not dbg.load_debug_rollout_data:
                    pending_rollout = self._pending = asyncio.ensure_future(self._rollout(k + 1, resume_only=True))
                elif not dbg.load_debug_rollout_data:
                    await self._end_rollout(k)
                # ---- train
                self.phase = "train"
                t0 = time.monotonic()
                results = await self._ask_trainers("train", {"rollout_id": k}, 3600)
                step["time/train"] = time.monotonic() - t0
                step.update({f"train/{key}": v for key, v in results[0].items()})
                await self._ask_buffer("mark_trained", {"rollout_id": k})
                # ---- weights
                self.version += 1
                if not dbg.debug_train_only:
                    t0 = time.monotonic()
                    info = await self._sync_all()
                    step["time/weight_sync"] = time.monotonic() - t0
                    step["weight_sync/bytes"] = info.get("bytes", 0)
            step["weight_version_after"] = self.version
            # ---- eval and checkpoint
            if a.eval.eval_interval and (k + 1) % a.eval.eval_interval == 0 and a.eval.eval_prompt_data \
                    and not dbg.debug_train_only:
                if pending_rollout is not None:
                    await self._pause_all()
                t0 = time.monotonic()
                ev = await self._evaluate(k + 1)
                step["time/eval"] = time.monotonic() - t0
                step.update({f"eval/{name}": r for name, r in ev.items()})
                if pending_rollout is not None:
                    await self._resume_all()
            every = a.checkpoint.save_interval
            if a.checkpoint.save and (stopping or every and ((k + 1) % every == 0 or k + 1 == a.run.num_rollout)):
                step["time/save"] = await self._save(k)
            if a.checkpoint.save_hf and not dbg.debug_rollout_only and hf_export_due(a, k):
                step["time/save_hf"] = await self._save_hf(k)
            step["time/step"] = time.monotonic() - t_step
            self._record(step)
            progress(step)
            if stopping:
                self.stopped = {"reason": stopping, "rollout_id": k, "steps_left": a.run.num_rollout - k - 1,
                                "checkpoint": str(self._ckpt) if self._ckpt else None}
                self.log.warning("run stopped by a hack alarm", reason=stopping, checkpoint=self.stopped["checkpoint"])
                progress.close()
                break
        end = self.stopped["rollout_id"] + 1 if self.stopped else a.run.num_rollout
        if pending_rollout is not None:
            pending_rollout.cancel()
        if a.eval.eval_prompt_data and not dbg.debug_train_only and not (
                a.eval.eval_interval and end % a.eval.eval_interval == 0) and end > start:
            await self._evaluate(end)
        self.accounting = await self._ask_buffer("accounting")
        self.phase = "done"
        await self.run_blocking(self._finish)   # the plot, closing TensorBoard and W&B: off the loop

    # ------------------------------------------------------------------------------------------ phases
    async def _startup_sync(self) -> None:
        """Wait for every engine, and bring them to the current weights (a resumed run starts at version > 0)."""
        t0 = None
        while len(self.engine_versions) < len(self.rollouts):
            if t0 is None:
                t0 = self.monotonic()
            elif self.monotonic() - t0 > 900:
                raise TimeoutError("engines did not report ready within 900 s: "
                                   f"{sorted(set(self.rollouts) - set(self.engine_versions))}")
            await asyncio.sleep(0.05)
        self.phase = "sync"
        behind = [w for w in self.rollouts if self.engine_versions.get(w) != self.version]
        if behind:
            async with self._sync_lock:
                await self._sync_weights(self.version, behind)
                for w in behind:
                    self.engine_versions[w] = self.version
        self.phase = "idle"

    async def _rollout(self, k: int, resume_only: bool = False) -> tuple[dict, float]:
        t0 = time.monotonic()
        self.phase = "rollout" if not resume_only else self.phase
        await self._ask_buffer("start_rollout", {"rollout_id": k, "weight_version": self.version}, timeout=300)
        await self._resume_all()
        stats = await self._ask_buffer("wait_rollout", {"rollout_id": k, "timeout": 86400.0}, timeout=86500)
        if not stats["complete"]:
            raise RuntimeError(f"rollout {k} did not complete: {stats}")
        return stats, time.monotonic() - t0

    def _hack_alarms(self, k: int, stats: dict, step: dict) -> str | None:
        """The buffer's hacking report on rollout k: hack/* metrics into the step, each tripped alarm into
        RUN_DIR/alarms.jsonl and a warning; with --hack-alarms stop and an alarm tripped, why the run stops."""
        metrics, tripped = record_hack_alarms(self.runtime.run_dir, k, stats.get("hack"), self.log)
        step.update(metrics)
        if tripped and self.cfg.monitor.hack_alarms == "stop":
            return stop_reason(k, tripped)
        return None

    async def _resume_all(self) -> None:
        for w in self.rollouts:
            if self.engine_versions.get(w) == self.version:
                await self.tell(w, "resume", {"weight_version": self.version})

    async def _pause_all(self) -> None:
        await asyncio.gather(*(self._quiet(self.ask(w, "pause", {}, timeout=60)) for w in self.rollouts))

    async def _end_rollout(self, k: int) -> None:
        await asyncio.gather(*(self._quiet(self.ask(w, "end_rollout", {"rollout_id": k}, timeout=120))
                               for w in self.rollouts))

    async def _sync_all(self) -> dict:
        async with self._sync_lock:
            ready = [w for w in self.rollouts if w in self.engine_versions]
            if self.cfg.run.async_train:
                await self._pause_all()
            for attempt in range(3):
                try:
                    info = await self._sync_weights(self.version, ready)
                    break
                except TrainerGroupFailed as exc:
                    # an engine that died mid-sync breaks the broadcast; its worker restarts it and the retry
                    # builds a new group (a dead trainer rank is confirmed instead, and handled by _run)
                    if exc.confirmed or attempt == 2:
                        raise
                    self.log.warning("weight sync failed; retrying with a new group", error=str(exc))
                    self._fresh_engines |= set(ready)
                    await asyncio.sleep(1.0)
            for w in ready:
                self.engine_versions[w] = self.version
            if self.cfg.run.async_train:
                await self._resume_all()
            return info

    async def _evaluate(self, step: int) -> dict[str, float]:
        from ..data import parse_eval_prompt_data
        prev = self.phase
        self.phase = "eval"
        out = {}
        for name, _ in parse_eval_prompt_data(self.cfg.eval.eval_prompt_data):
            eid = step * 1000 + len(self.evals)
            await self._ask_buffer("start_rollout", {"rollout_id": eid, "kind": "eval", "name": name,
                                                     "weight_version": self.version}, timeout=300)
            await self._resume_all()
            st = await self._ask_buffer("wait_rollout", {"rollout_id": eid, "kind": "eval", "timeout": 86400.0},
                                        timeout=86500)
            out[name] = st["reward_mean"] if st["reward_mean"] is not None else 0.0
            self.evals.append({"step": step, "name": name, "reward": out[name], "samples": st["samples"]})
            out.update({f"{name}-{key}": v for key, v in (st.get("passrate") or {}).items()})  # eval/NAME-pass@k
            self.log.info("eval", step=step, set=name, reward=round(out[name], 4), samples=st["samples"])
            if self.cfg.eval.save_eval_responses or self.cfg.logging.use_wandb:
                await self._save_eval(name, step, eid)
        if prev != "rollout":
            await self._pause_all()
        self.phase = prev
        return out

    async def _save(self, k: int) -> float:
        t0 = time.monotonic()
        root = Path(self.cfg.checkpoint.save)
        path = root / f"iter_{k + 1:07d}"
        path.mkdir(parents=True, exist_ok=True)
        save_optim = not self.cfg.checkpoint.no_save_optim
        await asyncio.gather(self._ask_trainers("save", {"path": str(path), "save_optim": save_optim}, 3600),
                             self._ask_buffer("save", {"path": str(path)}, timeout=600))
        meta = {"next_rollout_id": k + 1, "weight_version": self.version, "controller_rng": random.getstate(),
                "evals": self.evals, "time": time.time()}
        (path / "meta.json").write_text(json.dumps(meta))
        (root / "latest_checkpointed_iteration.txt").write_text(str(k + 1))
        self._ckpt = path  # what a restarted training group loads
        self.log.info("checkpoint saved", path=str(path))
        return time.monotonic() - t0

    async def _save_hf(self, k: int) -> float:
        """--save-hf after rollout k: every trainer rank takes part (gathering), rank 0 writes the directory."""
        t0 = time.monotonic()
        path = hf_export_path(self.cfg.checkpoint.save_hf, k)
        await self._ask_trainers("save_hf", {"path": str(path), "rollout_id": k}, 3600)
        self.log.info("HF model saved", path=str(path), rollout_id=k, weight_version=self.version)
        return time.monotonic() - t0

    async def _save_eval(self, name: str, step: int, eid: int) -> None:
        """The evaluation's responses, for a person to read (`slime-actors samples RUN --eval`, `--report`)."""
        rows = await self._ask_buffer("eval_results", {"rollout_id": eid}, timeout=300)
        if self.sinks is not None:
            self.sinks.eval_responses(name, step, rows)
        if not self.cfg.eval.save_eval_responses:
            return
        path = Path(self.runtime.run_dir) / EVAL_DIR / f"{name}_step{step:06d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps({**r, "step": step, "weight_version": self.version}, default=str) + "\n"
                               for r in rows))
        tmp.replace(path)

    def _show_samples(self, k: int, examples: list | None) -> None:
        """The best and the worst sample of one group (the buffer picks them): on the console every
        --log-samples-interval rollouts and after the last, as TensorBoard text every rollout, in the result."""
        if not examples:
            return
        from ..samples import format_examples
        self.last_examples = {"rollout_id": k, "examples": examples}
        every = self.cfg.logging.log_samples_interval
        if every and (k % every == 0 or k + 1 == self.cfg.run.num_rollout):
            console_write(format_examples(k, examples))
        if self.sinks is not None:
            self.sinks.samples(k, examples)

    async def _save_debug_rollout(self, k: int) -> None:
        import msgpack
        samples = await self._ask_buffer("dump_rollout", {"rollout_id": k}, timeout=300)
        path = debug_rollout_path(self.cfg.debug.save_debug_rollout_data, k)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(msgpack.packb({"rollout_id": k, "samples": samples}, use_bin_type=True))
        tmp.replace(path)  # a file that is there is complete
        self.log.info("saved rollout data", rollout_id=k, path=str(path), samples=len(samples))

    async def _load_debug_rollout(self, k: int) -> dict:
        """Rollout k from --load-debug-rollout-data (what --save-debug-rollout-data wrote): no engine involved."""
        import msgpack
        path = debug_rollout_path(self.cfg.debug.load_debug_rollout_data, k)
        if not path.exists():
            raise FileNotFoundError(f"--load-debug-rollout-data: no saved rollout {k} at {path} (it is written by "
                                    "--save-debug-rollout-data, one file per rollout id)")
        try:
            data = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
            samples = data["samples"]
            if not isinstance(samples, list) or not samples:
                raise ValueError("no samples in it")
        except Exception as exc:
            raise ValueError(f"--load-debug-rollout-data: {path} is not a saved rollout ({type(exc).__name__}: "
                             f"{exc}); expected what --save-debug-rollout-data writes") from None
        await self._ask_buffer("load_rollout", {"rollout_id": k, "samples": samples}, timeout=300)
        return await self._ask_buffer("wait_rollout", {"rollout_id": k, "timeout": 60.0}, timeout=90)

    @staticmethod
    async def _quiet(coro):
        try:
            return await coro
        except MailboxError:
            return None

    # ------------------------------------------------------------------------------------------ metrics
    async def _open_metrics(self, resume_at: int | None) -> None:
        """A new run starts metrics.jsonl and TensorBoard afresh (the run directory was cleared); a resumed run
        continues them: the rows of the rollouts before the checkpoint stay (in the history too, so curves.png
        spans the whole run), later rows -- trained again now -- are dropped, and TensorBoard hides its events
        from that step on (purge_step)."""
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        if resume_at is not None:
            self.history = _rows_before(self.metrics_path, resume_at) + self.history
            trim_alarms(self.runtime.run_dir, before=resume_at)
            tmp = self.metrics_path.with_name("metrics.jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in self.history))
            os.replace(tmp, self.metrics_path)
            self.log.info("continuing the run's metrics", rows_kept=len(self.history), from_rollout=resume_at)
        self._rows_before_start = len(self.history)
        self.metrics_file = open(self.metrics_path, "a")
        from ..metric_sinks import MetricSinks
        sinks = MetricSinks(self.cfg, self.runtime.run_dir, self.log)
        await self.run_blocking(sinks.open, resume_at)   # wandb.init starts a service: off the loop
        self.sinks = sinks

    def _record(self, step: dict) -> None:
        step["time"] = time.time()
        self.history.append(step)
        self.metrics_file.write(json.dumps(step) + "\n")
        self.metrics_file.flush()
        if self.sinks is not None:
            self.sinks.scalars(step)
        self.log.info("step", rollout_id=step["rollout_id"], reward=_r(step.get("rollout/reward_mean")),
                      loss=_r(step.get("train/loss")), logprob_diff=_r(step.get("train/train_rollout_logprob_abs_diff_max")),
                      seconds=_r(step.get("time/step")), version=step.get("weight_version_after"))

    def _finish(self) -> None:
        from ..plots import plot_run
        if self.metrics_file is not None:
            self.metrics_file.close()
        png = plot_run(self.runtime.run_dir, self.history, self.evals)
        if self.sinks is not None:
            self.sinks.close(png)
        first = {e["name"]: e["reward"] for e in self.evals if e["step"] == min(x["step"] for x in self.evals)} \
            if self.evals else {}
        last = {e["name"]: e["reward"] for e in self.evals if e["step"] == max(x["step"] for x in self.evals)} \
            if self.evals else {}
        self.result = {"status": "stopped" if self.stopped else "done", "stopped": self.stopped,
                       "steps": len(self.history) - self._rows_before_start, "eval_before": first,
                       "eval_after": last, "plot": png, "samples": self.last_examples, "weight_version": self.version,
                       "metrics": str(self.metrics_path), "recoveries": self.recoveries, "accounting": self.accounting}


def _r(v):
    return None if v is None else round(float(v), 4)


def _rows_before(path: Path, rollout_id: int) -> list[dict]:
    """metrics.jsonl rows of the rollouts before `rollout_id` (a torn last line, from a crash, is skipped)."""
    rows = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return rows
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("rollout_id"), int) and row["rollout_id"] < rollout_id:
            rows.append(row)
    return rows


def _tuple_state(s):
    return (s[0], tuple(s[1]), s[2])


def _progress(run: RunSection, start: int):
    """The progress bar: a part of the console's footer (log.CONSOLE), on a terminal only (--progress). Its
    `close()` takes it off (a run that ends early: --hack-alarms stop)."""
    def nothing(step: dict) -> None:
        return None
    nothing.close = lambda: None
    if not run.progress or not CONSOLE.interactive:
        return nothing
    t0 = time.monotonic()
    CONSOLE.footer("progress", progress_line("rl steps", start, run.num_rollout, None))
    last_eval: dict = {}

    def update(step: dict) -> None:
        done = step["rollout_id"] + 1
        last_eval.update({k[5:]: _r(v) for k, v in step.items() if k.startswith("eval/") and "-pass@" not in k})
        extra = {"reward": _r(step.get("rollout/reward_mean")), **{f"eval {k}": v for k, v in last_eval.items()}}
        rate = (time.monotonic() - t0) / max(done - start, 1)
        CONSOLE.footer("progress", None if done >= run.num_rollout else
                       progress_line("rl steps", done, run.num_rollout, rate, extra))
    update.close = lambda: CONSOLE.footer("progress", None)
    return update
