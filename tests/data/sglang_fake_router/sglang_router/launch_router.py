"""python -m sglang_router.launch_router --host H --port P [...]: the fake router (see __init__.py)."""
import argparse
import asyncio
import itertools
import sys
import uuid

from sglang_router.router_args import RouterArgs


def make_app(worker_urls):
    from aiohttp import ClientSession, web
    workers = {uuid.uuid4().hex: u for u in worker_urls}
    turn = itertools.count()
    stats = {"generate": 0}

    async def add(request):
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("url"), str):
            return web.json_response({"error": "url required"}, status=400)
        workers[uuid.uuid4().hex] = body["url"]
        print(f"fake-router: worker added {body['url']} ({body.get('worker_type')})", flush=True)
        return web.json_response({"status": "accepted"}, status=202)

    async def listing(request):
        return web.json_response({"workers": [{"id": i, "url": u, "worker_type": "regular", "is_healthy": True}
                                              for i, u in workers.items()], "total": len(workers),
                                  "stats": {"generate": stats["generate"]}})

    async def remove(request):
        if workers.pop(request.match_info["wid"], None) is None:
            return web.json_response({"error": "no such worker"}, status=404)
        return web.json_response({"status": "accepted"}, status=202)

    async def health(request):
        return web.Response(status=200)

    async def generate(request):
        if not workers:
            return web.json_response({"error": "no workers"}, status=503)
        urls = list(workers.values())
        url = urls[next(turn) % len(urls)]
        stats["generate"] += 1
        async with ClientSession() as s:
            async with s.post(url + "/generate", data=await request.read(),
                              headers={"Content-Type": "application/json",
                                       **({"Authorization": request.headers["Authorization"]}
                                          if "Authorization" in request.headers else {})}) as r:
                return web.Response(body=await r.read(), status=r.status, content_type="application/json")

    app = web.Application()
    app.router.add_post("/workers", add)
    app.router.add_get("/workers", listing)
    app.router.add_delete("/workers/{wid}", remove)
    app.router.add_get("/health", health)
    app.router.add_post("/generate", generate)
    return app


async def serve(host, port, worker_urls):
    from aiohttp import web
    runner = web.AppRunner(make_app(worker_urls))
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"fake-router: listening on {host}:{port}", flush=True)
    await asyncio.Event().wait()


def main(argv):
    p = argparse.ArgumentParser()
    RouterArgs.add_cli_args(p)
    a = p.parse_args(argv)
    asyncio.run(serve(a.host, a.port, a.worker_urls))


if __name__ == "__main__":
    main(sys.argv[1:])
