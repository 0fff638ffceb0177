"""A small demo: a directory and three actors in separate processes exchanging traced messages over CURVE."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time

import numpy as np

from .env import DIRECTORY, RUN_DIR
from .actors.base import Actor, handler
from .actors.directory import Directory
from .log import get_logger, setup_logging
from .mailbox.security import JobKeys
from .runtime import RuntimeConfig


class Squarer(Actor):
    role = "squarer"

    @handler
    def square(self, x: float) -> float:
        return x * x

    @handler
    def norms(self, rows) -> list:
        return np.linalg.norm(rows, axis=1)


class Summer(Actor):
    role = "summer"

    @handler
    async def sum_of_squares(self, xs: list) -> float:
        total = 0.0
        for x in xs:
            total += await self.ask("squarer/0", "square", {"x": x})
        return total


class Client(Actor):
    role = "client"


def _serve(cls, index: int, env: dict) -> None:
    os.environ.update(env)
    import uvloop
    setup_logging(env[RUN_DIR.name], f"{cls.role}/{index}", console=False)

    async def main():
        actor = cls(index)
        await actor.start(RuntimeConfig.from_env())
        await actor.wait_stopped()

    uvloop.run(main())


def run_demo(run_dir: str, messages: int = 200) -> int:
    import sys

    import uvloop

    from .run_dir import RunDirError, prepare_run_dir
    try:
        prepare_run_dir(run_dir)  # a directory that is not ours is refused; in ours, the last demo's files go
    except RunDirError as exc:
        print(f"slime-actors demo: error: {exc}", file=sys.stderr)
        return 2
    setup_logging(run_dir, "demo")
    log = get_logger(actor="demo")
    keys = JobKeys.create()
    keys.save(run_dir)

    async def main():
        rt = RuntimeConfig(run_dir=run_dir, curve=True)
        directory = Directory(0)
        ep = await directory.start(rt)
        env = {**rt.env(), DIRECTORY.name: ep}
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_serve, args=(cls, 0, env)) for cls in (Squarer, Summer)]
        for p in procs:
            p.start()
        client = Client(0)
        await client.start(RuntimeConfig(run_dir=run_dir, curve=True, directory=ep))
        t0 = time.perf_counter()
        total = 0.0
        for i in range(messages):
            total += await client.ask("squarer/0", "square", {"x": float(i)})
        s = await client.ask("summer/0", "sum_of_squares", {"xs": [1.0, 2.0, 3.0]})
        norms = await client.ask("squarer/0", "norms", {"rows": np.eye(4, dtype=np.float32) * 3})
        dt = time.perf_counter() - t0
        log.info("demo done", asks=messages + 2, seconds=round(dt, 3), sum=total, sum_of_squares=s,
                 norms=norms.tolist())
        for name in ("squarer/0", "summer/0"):
            await client.ask(name, "_stop", {"reason": "demo finished"})
        for p in procs:
            await asyncio.get_running_loop().run_in_executor(None, p.join, 10)
        await client.stop()
        await directory.stop()

    uvloop.run(main())
    from .traces.reader import TraceRun
    from .traces.summary import render
    print(render(TraceRun(run_dir)))
    print(f"\ntraces in {run_dir}/traces; try: slime-actors trace summary {run_dir}")
    return 0
