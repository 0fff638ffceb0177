"""python -m sglang_router.launch_router --host H --port P [...]: the fake router (see __init__.py)."""
import argparse
import asyncio
import itertools
import sys
import uuid

from sglang_router.router_args import RouterArgs


def _bearer(request, keys) -> bool:
    header = request.headers.get("Authorization", "")
    return header.startswith("Bearer ") and header[len("Bearer "):] in keys


def make_app(worker_urls, api_key=None, control_plane_keys=()):
    from aiohttp import ClientSession, web
    workers = {uuid.uuid4().hex: u for u in worker_urls}
    worker_keys = {}
    turn = itertools.count()
    stats = {"generate": 0, "refused": 0}
    admin_keys = set()
    for entry in control_plane_keys:  # ID:NAME:ROLE:KEY
        _id, _name, role, key = entry.split(":", 3)
        if role == "admin":
            admin_keys.add(key)

    @web.middleware
    async def auth(request, handler):
        if request.path.startswith("/workers") and control_plane_keys and not _bearer(request, admin_keys):
            stats["refused"] += 1
            return web.json_response({"error": "Missing or invalid Authorization header"}, status=401)
        if request.path == "/generate" and api_key and not _bearer(request, {api_key}):
            stats["refused"] += 1
            return web.Response(status=401)
        return await handler(request)

    async def add(request):
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("url"), str):
            return web.json_response({"error": "url required"}, status=400)
        wid = uuid.uuid4().hex
        workers[wid] = body["url"]
        worker_keys[wid] = body.get("api_key")
        print(f"fake-router: worker added {body['url']} ({body.get('worker_type')})", flush=True)
        return web.json_response({"status": "accepted"}, status=202)

    async def listing(request):
        return web.json_response({"workers": [{"id": i, "url": u, "worker_type": "regular", "is_healthy": True}
                                              for i, u in workers.items()], "total": len(workers),
                                  "stats": dict(stats)})

    async def remove(request):
        if workers.pop(request.match_info["wid"], None) is None:
            return web.json_response({"error": "no such worker"}, status=404)
        return web.json_response({"status": "accepted"}, status=202)

    async def health(request):
        return web.Response(status=200)

    async def generate(request):
        if not workers:
            return web.json_response({"error": "no workers"}, status=503)
        ids = list(workers)
        wid = ids[next(turn) % len(ids)]
        url, key = workers[wid], worker_keys.get(wid)
        stats["generate"] += 1
        async with ClientSession() as s:
            async with s.post(url + "/generate", data=await request.read(),
                              headers={"Content-Type": "application/json",
                                       **({"Authorization": f"Bearer {key}"} if key else {})}) as r:
                return web.Response(body=await r.read(), status=r.status, content_type="application/json")

    app = web.Application(middlewares=[auth])
    app.router.add_post("/workers", add)
    app.router.add_get("/workers", listing)
    app.router.add_delete("/workers/{wid}", remove)
    app.router.add_get("/health", health)
    app.router.add_post("/generate", generate)
    return app


async def serve(host, port, worker_urls, api_key=None, control_plane_keys=()):
    from aiohttp import web
    runner = web.AppRunner(make_app(worker_urls, api_key, control_plane_keys))
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"fake-router: listening on {host}:{port}", flush=True)
    await asyncio.Event().wait()


def main(argv):
    p = argparse.ArgumentParser()
    RouterArgs.add_cli_args(p)
    a = p.parse_args(argv)
    asyncio.run(serve(a.host, a.port, a.worker_urls, a.api_key, a.control_plane_api_keys))


if __name__ == "__main__":
    main(sys.argv[1:])
