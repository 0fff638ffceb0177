"""A /generate endpoint on 127.0.0.1 for slime's 3-argument custom generate functions.

slime's `generate(args, sample, sampling_params)` reaches its engine itself, by POSTing SGLang's /generate body to
`http://{args.sglang_router_ip}:{args.sglang_router_port}/generate`, without the engine's API key. A rollout worker
that runs such a function starts this proxy and hands the function a view of the flags whose router address is the
proxy's: each POST /generate is forwarded to the worker's engine (or router) through the worker's client -- with the
job's key, recorded in the trace like every engine answer -- and its answer returned as the engine gave it.

Only /generate (and /health, /health_generate for clients that probe first) are served; the engine's control
endpoints (weights, pauses, aborts) stay behind the admin key.

    proxy = GenerateProxy(forward)          # forward(body) -> (status, answer), e.g. EngineClient.generate_body
    host, port = await proxy.start()
    ...
    await proxy.stop()
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from ..json_files import parse_json

Forward = Callable[[dict], Awaitable[tuple[int, Any]]]


async def start_site(app, host: str, port: int = 0, reuse_port: bool = False) -> tuple[Any, int]:
    """Serve an aiohttp app on host:port (0: a free one): (its runner -- `await runner.cleanup()` stops it --, the
    port). The proxies here and the retriever (slime_actors/search/) start their servers with it."""
    from aiohttp import web
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


class GenerateProxy:
    def __init__(self, forward: Forward, host: str = "127.0.0.1"):
        self.forward = forward
        self.host = host
        self.port: int | None = None
        self.requests = 0
        self._runner = None

    async def start(self) -> tuple[str, int]:
        from aiohttp import web
        app = web.Application(client_max_size=256 << 20)
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health)
        self._runner, self.port = await start_site(app, self.host)
        return self.host, self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @staticmethod
    async def _health(request):
        from aiohttp import web
        return web.Response(status=200)

    async def _generate(self, request):
        from aiohttp import web

        from .engine_client import EngineError
        try:
            body = parse_json(await request.read())
        except ValueError as exc:   # (also UnicodeDecodeError, and JSON nested too deep to be read)
            return web.json_response({"error": {"message": f"the body is not JSON: {exc}"}}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "the body must be a JSON object (SGLang's "
                                                           "GenerateReqInput)"}}, status=400)
        self.requests += 1
        try:
            status, answer = await self.forward(body)
        except EngineError as exc:
            status = exc.status or 502
            return web.json_response({"error": {"message": str(exc)}}, status=status)
        return web.Response(text=json.dumps(answer), status=status, content_type="application/json")
