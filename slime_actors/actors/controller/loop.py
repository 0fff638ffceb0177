"""The RL loop on one page, as slime's train.py and train_async.py: `train_sync`, and `train_async` (--async-train).
The controller actor runs `run(ctl)`; `ctl` is what surface.py declares: the config, the weight version and the
phase, typed handles on the buffer and the trainer ranks (slime_actors/handles.py; `ctl.trainers.train(k)` asks
every rank at once), and the controller's parts, one file each in this package: `ctl.engines` (rollout workers:
resume, pause, end a rollout, weight sync), `ctl.group` (the trainer ranks' rendezvous, failure, restart),
`ctl.checkpoints` (--save, --save-hf, resume), `ctl.evaluations` (--eval-prompt-data), `ctl.debug_data`
(--save/--load-debug-rollout-data), `ctl.metrics` (metrics.jsonl, hack alarms, curves, the result).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Awaitable

from ...handles import outcome_seen
from ...messages import RolloutStats
from .metrics import timed

if TYPE_CHECKING:
    from .surface import Ctl


async def run(ctl: Ctl) -> None:
    """The job: start (or resume from a checkpoint), then the schedule. When a trainer rank dies the training group
    restarts from the last checkpoint and the schedule carries on from there (`ctl.group.supervise`)."""
    debug_cfg = ctl.cfg.debug
    overlap = ctl.cfg.run.async_train and not (debug_cfg.load_debug_rollout_data or debug_cfg.debug_rollout_only)
    schedule = train_async if overlap else train_sync

    async def job(resume_at: int | None) -> None:
        start = await prepare(ctl) if resume_at is None else await ctl.group.rejoin(resume_at)
        if not ctl.metrics.opened:
            # the training group failed while the job prepared (a trainer declared down under load), before the
            # metrics were opened: the restarted schedule records its steps all the same
            await ctl.metrics.open(resume_at=start if ctl.checkpoints.latest is not None else None)
        ctl.metrics.progress_from(start)
        await schedule(ctl, start)
        if ctl.evaluations.final_due(start, end=ctl.metrics.end):
            await ctl.evaluations.run(ctl.metrics.end)
    await ctl.group.supervise(job)
    await ctl.metrics.finish(accounting=await ctl.buffer.accounting())


async def prepare(ctl: Ctl) -> int:
    """Wait for every actor, restore the checkpoint (if any), bring the engines to its weights, evaluate step 0."""
    with ctl.startup.phase("actors up"):
        await ctl.wait_for_actors()
    start, ckpt = ctl.cfg.run.start_rollout_id or 0, ctl.checkpoints.latest
    if ckpt is not None:
        start, ctl.version = ctl.checkpoints.restore()
        ctl.log.info("resuming", checkpoint=str(ckpt), next_rollout=start, weight_version=ctl.version)
    # a restarted job (torchrun) finds the buffer ahead of the checkpoint: bring it back (a no-op otherwise)
    rb = await ctl.checkpoints.rollback_buffer(start, "job start", token=ctl.start_token())
    if ckpt is not None:  # (the summary says where the job started, and what a restarted one trained again)
        ctl.checkpoints.started_from = {"checkpoint": str(ckpt), "rollout": start,
                                        "retrained": len(rb.get("trained_rollouts_discarded") or [])}
    with ctl.startup.phase("trainers ready"):
        await ctl.group.ready()
    if not ctl.cfg.debug.debug_train_only:
        with ctl.startup.phase("engines ready + first weight sync"):
            await ctl.engines.sync_at_start()
    await ctl.metrics.open(resume_at=start if ckpt is not None else None)
    if ctl.evaluations.first_due(resumed=ckpt is not None):
        with ctl.startup.phase("evaluation before training"):
            await ctl.evaluations.run(start)
    return start


async def train_sync(ctl: Ctl, start: int) -> None:
    """slime's train.py. Step k: the engines generate rollout k and end it once it is complete (what is still
    generating goes back to the buffer); every trainer rank trains on its shard (the rollout's hack report and debug
    data meanwhile); weights v+1 go to every engine; evaluate and save when due."""
    debug_cfg = ctl.cfg.debug
    for k in range(start, ctl.cfg.run.n_rollouts):
        step = ctl.begin_step(k)
        with ctl.startup.phase(f"rollout {k}"):
            stats, seconds = await (ctl.debug_data.load(k) if debug_cfg.load_debug_rollout_data else generate(ctl, k))
            # the trainers start on rollout k at once; the step's bookkeeping (metrics, reports) goes on meanwhile
            training = None if debug_cfg.debug_rollout_only else await start_training(ctl, k, stats)
            with cancelled_on_error(training[0] if training else None):
                reports = await rollout_done(ctl, k, step, stats, seconds)
        with cancelled_on_error(reports):
            if training is None:
                await reports_in(ctl, k, step, reports)
                await ctl.buffer.mark_trained(k)             # nothing trains on it: the rollout is done with
            else:
                # what is still generating goes back to the buffer while the trainers fetch their shards (the shards
                # are the rollout's first complete groups: a group handed back is not among them)
                ending = None if debug_cfg.load_debug_rollout_data else await alongside(ctl.engines.end_rollout(k))
                # rollout k+1's groups are made meanwhile, held until the step after the weight sync starts it
                ahead = await alongside(make_ahead(ctl, k + 1, ending)) \
                    if ending is not None and ahead_due(ctl, k) else None
                await train(ctl, k, step, reports, training, ending, ahead)
        ctl.startup.first_step_done()                        # the start-up breakdown (startup.py)
        await evaluate_and_save(ctl, k, step)
        ctl.metrics.record(step)
        if ctl.metrics.stop_after(k):                        # --hack-alarms stop: an alarm tripped on rollout k
            break


async def train_async(ctl: Ctl, start: int) -> None:
    """slime's train_async.py (--async-train): rollout k+1 starts as soon as rollout k is complete and is generated
    while the trainers train on k (samples at most --max-staleness weight versions old: the buffer regenerates older
    ones); the engines pause for the weight update only."""
    n = ctl.cfg.run.n_rollouts
    next_rollout: asyncio.Future | None = None
    try:
        for k in range(start, n):
            step = ctl.begin_step(k)
            with ctl.startup.phase(f"rollout {k}"):
                stats, seconds = await (next_rollout or generate(ctl, k))
                reports = await rollout_done(ctl, k, step, stats, seconds)
            with cancelled_on_error(reports):
                next_rollout = asyncio.ensure_future(generate(ctl, k + 1, overlapped=True)) if k + 1 < n else None
                if next_rollout is None:
                    await ctl.engines.end_rollout(k)         # the last rollout: nothing follows it
                # (the engines pause only for the weight update)
                await train(ctl, k, step, reports, await start_training(ctl, k, stats))
            ctl.startup.first_step_done()
            await evaluate_and_save(ctl, k, step, engines_busy=next_rollout is not None)
            ctl.metrics.record(step)
            if ctl.metrics.stop_after(k):
                break
    finally:
        if next_rollout is not None:  # (the step failed or the job stops: the next rollout's outcome is not news)
            next_rollout.cancel()
            next_rollout.add_done_callback(outcome_seen)


async def generate(ctl: Ctl, k: int, overlapped: bool = False) -> tuple[RolloutStats, float]:
    """Rollout k, generated by the engines, and the seconds it took (`overlapped`: while the trainers train)."""
    t0 = time.monotonic()
    if not overlapped:
        ctl.phase = "rollout"
    # the engines resume (/continue_generation) while the buffer makes the rollout's groups -- or opens them, made
    # while the trainers trained on rollout k-1 (`make_ahead`) --: a worker's get_work waits for them
    await asyncio.gather(ctl.buffer.start_rollout(k, weight_version=ctl.version), ctl.engines.resume())
    stats = await ctl.buffer.wait_rollout(k, timeout=86400.0, hack=False, ask_timeout=86500)  # (the report: reports)
    if not stats.complete:
        raise RuntimeError(f"rollout {k} did not complete: {stats.wire}")
    return stats, time.monotonic() - t0


def ahead_due(ctl: Ctl, k: int) -> bool:
    """Whether rollout k+1 is made while the trainers train on k (`make_ahead`, only when the engines end rollout k:
    not with --load-debug-rollout-data): not after the last rollout, nor when an evaluation comes first (its groups
    are numbered first, as they always were: the samples' numbers, and with them their sampling seeds, are a run's
    that makes nothing ahead), nor when a checkpoint is saved after step k (its buffer holds no rollout made ahead,
    with groups leased to workers that a resumed job would not have: the resumed run is the one that went on). The
    save a --hack-alarms stop makes is known only once step k's report is in, after this: that checkpoint holds
    rollout k+1 (docs/fault-tolerance.md)."""
    return k + 1 < ctl.cfg.run.n_rollouts and not ctl.evaluations.due(k) and \
        not ctl.checkpoints.save_due(k, stopping=bool(ctl.metrics.stopping))


async def make_ahead(ctl: Ctl, k: int, ending: asyncio.Future) -> None:
    """Rollout k's groups made while the trainers train on rollout k-1 -- once the engines gave k-1's unfinished
    groups back (`ending`), so they are among them as when k starts after the weight sync -- and held by the buffer:
    none is handed out until `generate` starts rollout k, after the weight sync, but to the rollout workers, which
    take their share now and start it when they are resumed at the new weights. The step's first requests then go
    out when the resume arrives, instead of after the buffer made and logged every group and a worker pulled and
    decoded them (docs/performance.md)."""
    await ending
    await ctl.buffer.start_rollout(k, weight_version=ctl.version + 1, hold=True)
    # the workers lease its groups now, and start them at their resume after the weight sync
    await ctl.engines.take_ahead(k)


async def rollout_done(ctl: Ctl, k: int, step: dict, stats: RolloutStats, seconds: float) -> asyncio.Future:
    """After each rollout: its statistics into the metrics, samples on the console. Returns the rest, started here
    and run while the trainers train (nothing in it decides what they do): the buffer's hack report on the rollout
    and the debug data (--save-debug-rollout-data) -- `reports_in` takes them before the buffer frees the rollout."""
    await ctl.metrics.on_rollout_done(k, step, stats, seconds)
    # (two tasks, created in this order: the hack_report ask goes out before dump_rollout's, every time)
    return asyncio.gather(hack_report(ctl, k), save_debug_data(ctl, k))


async def hack_report(ctl: Ctl, k: int) -> dict | None:
    """The buffer's reward-hacking report on rollout k (None with --hack-alarms off: nothing is asked)."""
    return None if ctl.cfg.monitor.hack_alarms == "off" else await ctl.buffer.hack_report(k)


async def save_debug_data(ctl: Ctl, k: int) -> None:
    if ctl.cfg.debug.save_debug_rollout_data:
        await ctl.debug_data.save(k)


async def reports_in(ctl: Ctl, k: int, step: dict, reports: asyncio.Future) -> None:
    """Wait for rollout k's reports (`rollout_done`; a failed one -- a debug-data file not written -- fails the
    step, as it always did): the hack alarms into the step's metrics (and --hack-alarms stop's decision)."""
    hack, _ = await reports
    ctl.metrics.on_hack_report(k, step, hack)


async def alongside(call: Awaitable[Any]) -> asyncio.Future:
    """`call` (an ask) started now -- sent before this returns, so the messages go out in the order the step makes
    them -- to be awaited later: the step goes on meanwhile."""
    task = asyncio.ensure_future(call)
    await asyncio.sleep(0)
    return task


@contextmanager
def cancelled_on_error(work: asyncio.Future | None):
    """The step failed before it took `work` (its reports, the engines ending the rollout): stop it (the rollout is
    generated again or the job ends)."""
    try:
        yield
    except BaseException:
        if work is not None:
            work.cancel()
            work.add_done_callback(outcome_seen)   # (the step's own error is the one raised)
        raise


async def start_training(ctl: Ctl, k: int, stats: RolloutStats) -> tuple[asyncio.Future, float]:
    """Every trainer rank asked to train on its shard of rollout k -- the batch `stats` names, which the ranks
    fetched already (wait_batch) unless it was made again since --: (the asks, when they were sent)."""
    ctl.phase = "train"
    t0 = time.monotonic()
    return await alongside(ctl.trainers.train(k, batch_id=stats.wire.get("batch_id"), ask_timeout=3600)), t0


async def train(ctl: Ctl, k: int, step: dict, reports: asyncio.Future, training: tuple[asyncio.Future, float],
                ending: asyncio.Future | None = None, ahead: asyncio.Future | None = None) -> None:
    """Every trainer rank trains on its shard of rollout k (`training`: asked, `start_training`); its reports come
    in; the buffer frees it (during the weight sync); the engines get weights v+1 once `ending` (the engines ending
    rollout k) and `ahead` (rollout k+1 made, held: `make_ahead`) are done."""
    asked, t0 = training
    with cancelled_on_error(ending), cancelled_on_error(ahead):
        with ctl.startup.phase(f"train {k}"):
            results = await asked
        seconds = time.monotonic() - t0
        await reports_in(ctl, k, step, reports)      # (the row's hack/* columns come before time/train, as ever)
        if ending is not None:
            await ending
        if ahead is not None:
            await ahead
    step["time/train"] = seconds
    step.update({f"train/{key}": v for key, v in results[0].items()})
    marked = await alongside(ctl.buffer.mark_trained(k))   # (it reaches the buffer whatever happens)
    try:
        ctl.version += 1
        if not ctl.cfg.debug.debug_train_only:
            with timed(step, "time/weight_sync"), ctl.startup.phase(f"weight sync {k}"):
                info = await ctl.engines.sync(ctl.version)
            step["weight_sync/bytes"] = info.get("bytes", 0)
    except BaseException:
        marked.add_done_callback(outcome_seen)       # (the sync's error is the one raised)
        raise
    await marked


async def evaluate_and_save(ctl: Ctl, k: int, step: dict, engines_busy: bool = False) -> None:
    """After rollout k: evaluate every --eval-interval steps; save every --save-interval steps, at the end, to stop."""
    step["weight_version_after"] = ctl.version
    if ctl.evaluations.due(k):
        async with ctl.engines.paused(engines_busy):         # a rollout generating meanwhile waits for the eval
            with timed(step, "time/eval"):
                results = await ctl.evaluations.run(k + 1)
        step.update({f"eval/{name}": r for name, r in results.items()})
    if ctl.checkpoints.save_due(k, stopping=bool(ctl.metrics.stopping)):
        step["time/save"] = await ctl.checkpoints.save(k)
    if ctl.checkpoints.save_hf_due(k):
        step["time/save_hf"] = await ctl.checkpoints.save_hf(k)
