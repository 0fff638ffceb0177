"""What the benches that run actors in processes of their own share: CPU work of a set length, a fake engine that
holds /generate requests until a schedule lets them go, and an actor's process. Not a bench itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


def busy(seconds: float) -> None:
    """`seconds` of CPU (a handler's work, as a bench stands it in)."""
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


def held_engine(n: int, body: bytes, release: Callable[[list[asyncio.Future]], Awaitable[None]],
                on_port: Callable[[int], None]) -> None:
    """Serves POST /generate on loopback (uvloop; runs until killed): each request is held until `n` have come,
    then `release(held)` lets them go -- a future each, in the order they came, set when its answer, `body`, is to
    go out. `on_port(port)` once it listens."""
    import uvloop
    from aiohttp import web
    held: list[asyncio.Future] = []

    async def generate(req):
        await req.read()
        fut = asyncio.get_running_loop().create_future()
        held.append(fut)
        if len(held) == n:
            out, held[:] = list(held), []
            asyncio.get_running_loop().create_task(release(out))
        await fut
        return web.Response(body=body, content_type="application/json")

    async def main():
        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        on_port(runner.addresses[0][1])
        await asyncio.Event().wait()
    uvloop.run(main())


def actor_process(make: Callable, run_dir: str, name: str, on_ready: Callable[[str], None],
                  trace: bool | None = None) -> None:
    """Runs the actor `make()` on uvloop until it stops, logging to run_dir as `name`; `on_ready(its endpoint)`
    once it serves. `trace`: whether it traces its messages (None: the runtime's default)."""
    import uvloop

    from slime_actors.log import setup_logging
    from slime_actors.runtime import RuntimeConfig
    setup_logging(run_dir, name, console=False, level="warning")

    async def main():
        actor = make()
        extra = {} if trace is None else {"trace": trace}
        await actor.start(RuntimeConfig(run_dir=run_dir, curve=False, **extra))
        on_ready(actor.endpoint)
        await actor.wait_stopped()
    uvloop.run(main())
