"""What reading an HTTP answer with a bound costs (slime_actors/http_answers.py) beside aiohttp's whole read.

    .venv/bin/python bench/http_answers.py [--requests 500] [--rounds 5]

A rollout worker reads one engine answer per group (a batched /generate answer with log-probs: 68 KB for 8 answers
of 190 tokens), a remote reward or a retriever one per call. `read_answer` reads an answer with a Content-Length in
one piece, like `resp.read()`, and one without a length (chunked) or compressed a chunk at a time up to the bound.
For each kind of answer the two ways are timed on the same server in alternating rounds of --requests requests;
the table shows the median per answer and the ratio. Client and server share one event loop and one process, so
the figures include the server's side: compare within a row.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import statistics
import sys
import time

import aiohttp
from aiohttp import web

from slime_actors.backends.generate_proxy import start_site
from slime_actors.http_answers import read_answer

KB68 = b'{"text": "' + b"y" * (68 << 10) + b'"}'
MB4 = b'{"text": "' + b"y" * (4 << 20) + b'"}'
LIMIT = 1 << 30


def _answers() -> dict[str, tuple[bytes, str]]:
    """name -> (body, how it is sent)."""
    return {"68 KB, Content-Length": (KB68, "length"), "68 KB, chunked": (KB68, "chunked"),
            "68 KB, gzip": (gzip.compress(KB68), "gzip"), "4 MB, Content-Length": (MB4, "length")}


async def _serve(answers):
    async def handle(request):
        body, how = answers[request.match_info["name"]]
        if how == "length":
            return web.Response(body=body, content_type="application/json")
        if how == "gzip":
            return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(body), 16 << 10):
            await resp.write(body[i:i + (16 << 10)])
        await resp.write_eof()
        return resp
    app = web.Application()
    app.router.add_get("/{name}", handle)
    runner, port = await start_site(app, "127.0.0.1")
    return runner, f"http://127.0.0.1:{port}"


async def main(requests: int, rounds: int) -> list[tuple[str, float, float]]:
    answers = _answers()
    keys = {name: f"a{i}" for i, name in enumerate(answers)}
    runner, base = await _serve({keys[n]: v for n, v in answers.items()})
    rows = []
    try:
        async with aiohttp.ClientSession() as cs:
            async def whole(url):
                async with cs.get(url) as resp:
                    return await resp.read()

            async def bounded(url):
                async with cs.get(url) as resp:
                    return await read_answer(resp, LIMIT)
            for name, (body, how) in answers.items():
                url = f"{base}/{keys[name]}"
                want = gzip.decompress(body) if how == "gzip" else body
                times: dict[str, list[float]] = {"read": [], "bounded": []}
                for _ in range(rounds):
                    for way, fn in (("read", whole), ("bounded", bounded)):
                        t0 = time.perf_counter()
                        for _ in range(requests):
                            if await fn(url) != want:
                                raise SystemExit(f"{name}: {way} read a different answer")
                        times[way].append((time.perf_counter() - t0) / requests * 1e6)
                rows.append((name, statistics.median(times["read"]), statistics.median(times["bounded"])))
    finally:
        await runner.cleanup()
    return rows


def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=500, help="requests a round, each way (default 500)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    a = ap.parse_args(argv)
    if a.requests < 1 or a.rounds < 1:
        ap.error("--requests and --rounds must be >= 1")
    rows = asyncio.run(main(a.requests, a.rounds))
    print(f"reading an answer: aiohttp's resp.read() against read_answer (bound {LIMIT:,} bytes); median of "
          f"{a.rounds} rounds of {a.requests} requests, alternating, one process")
    print("| answer | resp.read() (µs) | read_answer (µs) | read_answer / read() |")
    print("|---|---|---|---|")
    for name, whole, bounded in rows:
        print(f"| {name} | {whole:,.1f} | {bounded:,.1f} | {bounded / whole:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
