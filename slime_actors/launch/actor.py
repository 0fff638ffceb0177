"""Run one actor in this process: `python -m slime_actors.launch.actor ROLE INDEX`.

The job's config comes from the file named by SLIME_ACTORS_JOB (written by the launcher; rebuilt typed here, an
error naming the file and the field when it is malformed); where the job lives (run directory, directory endpoint,
keys, tracing) from the SLIME_ACTORS_* environment (slime_actors.env, slime_actors.runtime).
SIGTERM and SIGINT stop the actor cleanly (on_stop, deregister, traces flushed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from .. import env as E
from ..config import ConfigError, JobConfig


def load_job_config(path: str | None = None) -> JobConfig | None:
    """The job's typed config from its job file (SLIME_ACTORS_JOB); None when there is none. SystemExit naming the
    file (and the field) when it is missing or malformed."""
    path = path or E.JOB.get()
    if not path:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise SystemExit(f"error: job file {path} ({E.JOB.name}) does not exist") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"error: job file {path} is not valid JSON: {exc}") from None
    try:
        return JobConfig.from_dict(data, source=f"job file {path}")
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slime_actors.launch.actor")
    p.add_argument("role")
    p.add_argument("index", type=int)
    ns = p.parse_args(argv)
    import uvloop

    from ..log import get_logger, setup_logging
    from ..runtime import RuntimeConfig
    from .roles import job_class_for

    rt = RuntimeConfig.from_env()
    name = f"{ns.role}/{ns.index}"
    cpus = E.CPUS.get()  # the topology's CPU affinity (also when srun/torchrun start us)
    if cpus:
        try:
            os.sched_setaffinity(0, [int(c) for c in cpus.split(",") if c.strip()])
        except (OSError, ValueError) as exc:
            print(f"warning: {E.CPUS.name}={cpus!r} not applied: {exc}", file=sys.stderr)
    setup_logging(rt.run_dir, name, console=True)
    log = get_logger(actor=name)
    job = load_job_config()
    # a job may play a role with the user's own class: --reward-actor-class pkg.mod:Class (see docs/adding-a-reward-actor.md)
    # or the topology's `class` for this role (SLIME_ACTORS_ACTOR_CLASS, set by the placement)
    try:
        cls = job_class_for(ns.role, job)
    except Exception as exc:  # a bad class path, an import error in the user's module, a wrong role
        log.error("cannot build the actor", error=str(exc))
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    config = {"args": job.to_dict()} if job is not None else {}

    async def run() -> int:
        import asyncio
        actor = cls(ns.index, **config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda s=sig: actor.spawn(actor.stop(f"signal {signal.Signals(s).name}")))
        try:
            await actor.start(rt)
        except Exception as exc:
            log.error("actor failed to start", error=repr(exc))
            await actor.stop("failed to start")
            return 1
        await actor.wait_stopped()
        return 0

    try:
        return uvloop.run(run())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
