"""Retrievals per second of the retriever (slime_actors/search/server.py) on this machine, at concurrency 1 and 32.

    .venv/bin/python bench/retriever.py [--seconds 5] [--people 300 20000]

One retriever process per corpus (`python -m slime_actors.search.server`, BM25 over a natural world of that many
people, keyed as in a job), one client process (aiohttp) sending Search-R1's POST /retrieve with one question each
(topk 3, return_scores true, the questions of the world in turn) -- `concurrency` requests in flight at once, for
`--seconds` each. A row: the corpus, concurrency, requests per second, and the latency's median and 99th percentile.
One more row per corpus sends 8 questions per request at concurrency 32 (queries per second counts questions).

The retriever's share of a rollout needs the search environment (issue 30's environment part), which is not
written yet: it is not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEY = "bench-key-0123456789abcdef"


def start_server(corpus: Path, cache: Path, port: int, env: dict) -> subprocess.Popen:
    keyfile = corpus.parent / "key"
    keyfile.write_text(KEY + "\n")
    os.chmod(keyfile, 0o600)
    return subprocess.Popen([sys.executable, "-m", "slime_actors.search.server", "--corpus", str(corpus),
                             "--port", str(port), "--api-key-file", str(keyfile), "--cache-dir", str(cache)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def wait_up(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    import aiohttp
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                raise SystemExit(f"the retriever exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise SystemExit("the retriever did not come up")


async def run(url: str, questions: list[str], concurrency: int, seconds: float, per_request: int) -> dict:
    import aiohttp
    lat: list[float] = []
    done = 0
    headers = {"Authorization": f"Bearer {KEY}"}
    deadline = time.monotonic() + seconds
    nxt = 0

    async def worker(session):
        nonlocal done, nxt
        while time.monotonic() < deadline:
            qs = [questions[(nxt + j) % len(questions)] for j in range(per_request)]
            nxt += per_request
            t0 = time.perf_counter()
            async with session.post(url + "/retrieve", json={"queries": qs, "topk": 3, "return_scores": True},
                                    headers=headers) as r:
                body = await r.read()
                assert r.status == 200, body[:300]
            lat.append(time.perf_counter() - t0)
            done += 1
    conn = aiohttp.TCPConnector(limit=concurrency)
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    wall = time.monotonic() - t0
    lat.sort()
    return {"requests/s": done / wall, "queries/s": done * per_request / wall,
            "p50 ms": 1000 * statistics.median(lat), "p99 ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--people", type=int, nargs="+", default=[300, 20000])
    ns = p.parse_args()
    from slime_actors.backends.weight_sync import find_free_port
    from slime_actors.search.corpus import natural_world
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for people in ns.people:
            world = natural_world(7, people=people, heldout_people=max(1, people // 6))
            d = world.write(Path(tmp) / f"w{people}")
            questions = [r["metadata"]["question"] for r in world.train]
            port = find_free_port("127.0.0.1")
            proc = start_server(d / "corpus.jsonl", Path(tmp) / "cache", port, env)
            url = f"http://127.0.0.1:{port}"
            try:
                asyncio.run(wait_up(url, proc))
                for conc, per in ((1, 1), (32, 1), (32, 8)):
                    r = asyncio.run(run(url, questions, conc, ns.seconds, per))
                    rows.append((len(world.docs), conc, per, r))
                    print(f"  {len(world.docs)} docs, concurrency {conc}, {per} question(s)/request: "
                          f"{r['queries/s']:.0f} questions/s", file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(10)
    print(f"retriever (BM25, bm25s), {os.cpu_count()} CPU(s), {ns.seconds:g} s per row, topk 3, return_scores true\n")
    print("| documents | concurrency | questions / request | requests / s | questions / s | p50 ms | p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for docs, conc, per, r in rows:
        print(f"| {docs} | {conc} | {per} | {r['requests/s']:.0f} | {r['queries/s']:.0f} | {r['p50 ms']:.1f} | "
              f"{r['p99 ms']:.1f} |")
    print("\nthe retriever's share of a rollout: not measured (it needs the search environment, not written yet)")
    print(json.dumps({"rows": [{"docs": d, "concurrency": c, "per_request": p, **r} for d, c, p, r in rows]}),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
