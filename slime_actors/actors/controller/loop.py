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
from typing import TYPE_CHECKING

from ...messages import RolloutStats
from .metrics import timed

if TYPE_CHECKING:
    from .surface import Ctl


async def run(ctl: Ctl) -> None:
    """The job: start (or resume from a checkpoint), then the schedule. When a trainer rank dies the training group
    restarts from the last checkpoint and the schedule carries on from there (`ctl.group.supervise`)."""
    dbg = ctl.cfg.debug
    overlap = ctl.cfg.run.async_train and not (dbg.load_debug_rollout_data or dbg.debug_rollout_only)
    schedule = train_async if overlap else train_sync

    async def job(resume_at: int | None) -> None:
        if resume_at is None:
            start = await prepare(ctl)
        else:
            start = await ctl.group.rejoin(resume_at)
            if not ctl.metrics.opened:   # the group failed in `prepare`, before it opened them (a loaded machine)
                await ctl.metrics.open(resume_at=start if ctl.checkpoints.latest is not None else None)
        ctl.metrics.progress_from(start)
        await schedule(ctl, start)
        if ctl.evaluations.final_due(start, end=ctl.metrics.end):
            await ctl.evaluations.run(ctl.metrics.end)
    await ctl.group.supervise(job)
    await ctl.metrics.finish(accounting=await ctl.buffer.accounting())


async def prepare(ctl: Ctl) -> int:
    """Wait for every actor, restore the checkpoint (if any), bring the engines to its weights, evaluate step 0."""
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
    await ctl.group.ready()
    if not ctl.cfg.debug.debug_train_only:
        await ctl.engines.sync_at_start()
    await ctl.metrics.open(resume_at=start if ckpt is not None else None)
    if ctl.evaluations.first_due(resumed=ckpt is not None):
        await ctl.evaluations.run(start)
    return start


async def train_sync(ctl: Ctl, start: int) -> None:
    """slime's train.py. Step k: the engines generate rollout k and end it once it is complete (what is still
    generating goes back to the buffer); every trainer rank trains on its shard; weights v+1 go to every engine;
    evaluate and save when due."""
    dbg = ctl.cfg.debug
    for k in range(start, ctl.cfg.run.n_rollouts):
        step = ctl.begin_step(k)
        stats, seconds = await (ctl.debug_data.load(k) if dbg.load_debug_rollout_data else generate(ctl, k))
        await rollout_done(ctl, k, step, stats, seconds)
        if dbg.debug_rollout_only:
            await ctl.buffer.mark_trained(k)                 # nothing trains on it: the rollout is done with
        else:
            if not dbg.load_debug_rollout_data:
                await ctl.engines.end_rollout(k)             # what is still generating goes back to the buffer
            await train(ctl, k, step)
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
            stats, seconds = await (next_rollout or generate(ctl, k))
            await rollout_done(ctl, k, step, stats, seconds)
            next_rollout = asyncio.ensure_future(generate(ctl, k + 1, overlapped=True)) if k + 1 < n else None
            if next_rollout is None:
                await ctl.engines.end_rollout(k)             # the last rollout: nothing follows it
            await train(ctl, k, step)                        # the engines pause only for the weight update
            await evaluate_and_save(ctl, k, step, engines_busy=next_rollout is not None)
            ctl.metrics.record(step)
            if ctl.metrics.stop_after(k):
                break
    finally:
        if next_rollout is not None:
            next_rollout.cancel()


async def generate(ctl: Ctl, k: int, overlapped: bool = False) -> tuple[RolloutStats, float]:
    """Rollout k, generated by the engines, and the seconds it took (`overlapped`: while the trainers train)."""
    t0 = time.monotonic()
    if not overlapped:
        ctl.phase = "rollout"
    await ctl.buffer.start_rollout(k, weight_version=ctl.version)
    await ctl.engines.resume()
    stats = await ctl.buffer.wait_rollout(k, timeout=86400.0, ask_timeout=86500)
    if not stats.complete:
        raise RuntimeError(f"rollout {k} did not complete: {stats.wire}")
    return stats, time.monotonic() - t0


async def rollout_done(ctl: Ctl, k: int, step: dict, stats: RolloutStats, seconds: float) -> None:
    """After each rollout: its statistics and hack alarms into the metrics, samples on the console; debug data."""
    await ctl.metrics.on_rollout_done(k, step, stats, seconds)
    if ctl.cfg.debug.save_debug_rollout_data:
        await ctl.debug_data.save(k)


async def train(ctl: Ctl, k: int, step: dict) -> None:
    """Every trainer rank trains on its shard of rollout k; the buffer frees it; the engines get weights v+1."""
    ctl.phase = "train"
    with timed(step, "time/train"):
        results = await ctl.trainers.train(k, ask_timeout=3600)
    step.update({f"train/{key}": v for key, v in results[0].items()})
    await ctl.buffer.mark_trained(k)
    ctl.version += 1
    if not ctl.cfg.debug.debug_train_only:
        with timed(step, "time/weight_sync"):
            info = await ctl.engines.sync(ctl.version)
        step["weight_sync/bytes"] = info.get("bytes", 0)


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
