"""Run one actor in this process: `python -m slime_actors.launch.actor ROLE INDEX`.

The job's config comes from the file named by SLIME_ACTORS_JOB (written by the launcher; rebuilt typed here, an
error naming the file and the field when it is malformed); where the job lives (run directory, directory endpoint,
keys, tracing) from the SLIME_ACTORS_* environment (slime_actors.env, slime_actors.runtime).
SIGTERM and SIGINT stop the actor cleanly (on_stop, deregister, traces flushed). How the start went is reported
for the supervisor (launch/startup.py): "ready" once on_start finished, else the cause -- and exit code 78 when no
restart can change it.

Every actor process goes through this module's bootstrap, however it was started -- this entry (`slime-actors
launch`'s and Slurm's processes), a torchrun rank (launch/torchrun.py), a test's child process: `set_up_process`
(the topology's CPU affinity, logging to RUN_DIR/logs, its stacks dumped on SIGUSR1 and SIGUSR2: launch/stacks.py),
then `serve` (start the actor -- again while the head is not reachable yet, when a join policy says so --, stop it
cleanly on SIGTERM/SIGINT, wait until it has stopped).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import gc_watch
from ..env import CPUS, JOB
from ..actors.base import Actor
from ..config import ConfigError, JobConfig
from ..retry import RetryPolicy, retry
from ..runtime import RuntimeConfig
from . import stacks


def load_job_config(path: str | None = None) -> JobConfig | None:
    """The job's typed config from its job file (SLIME_ACTORS_JOB); None when there is none. SystemExit naming the
    file (and the field) when it is missing or malformed."""
    path = path or JOB.get()
    if not path:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise SystemExit(f"error: job file {path} ({JOB.name}) does not exist") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"error: job file {path} is not valid JSON: {exc}") from None
    try:
        return JobConfig.from_dict(data, source=f"job file {path}")
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None


def set_up_process(name: str, run_dir: str | None, *, console: bool = True):
    """What an actor process does first: pin itself to the topology's CPUs (SLIME_ACTORS_CPUS, set by its placement)
    and log to RUN_DIR/logs/NAME.jsonl (and the console). Returns the process's logger."""
    from ..log import get_logger, setup_logging
    cpus = CPUS.get()
    if cpus:
        try:
            os.sched_setaffinity(0, [int(c) for c in cpus.split(",") if c.strip()])
        except (OSError, ValueError) as exc:
            print(f"warning: {CPUS.name}={cpus!r} not applied: {exc}", file=sys.stderr)
    setup_logging(run_dir, name, console=console)
    stacks.register()   # SIGUSR1 / SIGUSR2: every thread's stack to stderr (the supervisor's; `slime-actors stacks`)
    log = get_logger(actor=name)
    gc_watch.watch(log)   # long garbage collections logged (gc_watch.settle freezes start-up's objects once started)
    return log


async def serve(make: Callable[[], Awaitable[tuple[Actor, RuntimeConfig]]], *, join: RetryPolicy | None = None,
                ready: Callable[[Actor], Any] | None = None) -> str | None:
    """An actor's life in its process: `make()` builds it and the runtime it starts on; it starts (with `join`,
    again -- a fresh actor from `make()` each time -- while the policy retries the failure and no signal came);
    SIGTERM / SIGINT stop it cleanly; `ready(actor)` runs once it has started. Returns the name of the signal that
    stopped it, or None when it stopped by itself (asked to, the job ended). A start that fails stops the actor and
    raises (with `join`: once the policy gives up)."""
    loop = asyncio.get_running_loop()
    current: list = [None, None]   # the actor, the signal received

    def on_signal(sig: signal.Signals) -> None:
        current[1] = current[1] or sig.name
        if current[0] is not None:
            current[0].spawn(current[0].stop(f"signal {sig.name}"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    async def start() -> Actor:
        actor, runtime = await make()
        current[0] = actor
        try:
            await actor.start(runtime)
        except BaseException:
            await actor.stop("failed to start")
            raise
        return actor
    if join is None:
        actor = await start()
    else:
        policy = join.replace(retry_if=lambda exc, f=join.retry_if: current[1] is None and (f is None or f(exc)))
        actor = await retry(start, policy, what="joining the head", started=time.monotonic())
    if current[1] is not None:  # a signal came while it started
        actor.spawn(actor.stop(f"signal {current[1]}"))
    elif ready is not None:
        ready(actor)
    await actor.wait_stopped()
    return current[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slime_actors.launch.actor")
    p.add_argument("role")
    p.add_argument("index", type=int)
    ns = p.parse_args(argv)
    import uvloop

    from .roles import job_class_for
    from .startup import EXIT_PERMANENT, Cause, cause_of, write_report

    rt = RuntimeConfig.from_env()
    name = f"{ns.role}/{ns.index}"
    log = set_up_process(name, rt.run_dir)
    try:
        job = load_job_config()
    except SystemExit as exc:  # a missing or malformed job file: no restart changes it
        write_report(rt.run_dir, name, "failed", Cause(str(exc.code), True))
        print(f"{name}: {exc.code}", file=sys.stderr)
        return EXIT_PERMANENT
    # a job may play a role with the user's own class: --reward-actor-class pkg.mod:Class (see docs/adding-a-reward-actor.md)
    # or the topology's `class` for this role (SLIME_ACTORS_ACTOR_CLASS, set by the placement)
    from .. import startup_timeline as timeline
    try:
        with timeline.phase("role's code"):
            cls = job_class_for(ns.role, job)
    except Exception as exc:  # a bad class path, an import error in the user's module, a wrong role
        log.error("cannot build the actor", error=str(exc))
        print(f"{name}: {exc}", file=sys.stderr)
        write_report(rt.run_dir, name, "failed", Cause(f"cannot build the actor: {exc}", True))
        return EXIT_PERMANENT
    async def make():
        return (cls.for_job(ns.index, job) if job is not None else cls(ns.index)), rt

    async def run() -> int:
        try:
            await serve(make, ready=lambda actor: (write_report(rt.run_dir, name, "ready"), gc_watch.settle(log)))
        except Exception as exc:
            cause = cause_of(exc)
            log.error("actor failed to start", error=repr(exc), cause=cause.text, permanent=cause.permanent)
            write_report(rt.run_dir, name, "failed", cause)
            return EXIT_PERMANENT if cause.permanent else 1
        return 0

    try:
        return uvloop.run(run())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
