"""Retrievals per second of the retriever (slime_actors/search/server.py) on this machine, at concurrency 1 and 32.

    .venv/bin/python bench/retriever.py [--seconds 5] [--people 300 20000]

One retriever process per corpus (`python -m slime_actors.search.server`, BM25 over a natural world of that many
people, keyed as in a job), one client process (aiohttp) sending Search-R1's POST /retrieve with one question each
(topk 3, return_scores true, the questions of the world in turn) -- `concurrency` requests in flight at once, for
`--seconds` each. A row: the corpus, concurrency, requests per second, and the latency's median and 99th percentile.
One more row per corpus sends 8 questions per request at concurrency 32 (queries per second counts questions).

The retriever's share of a rollout: a short search job (examples/search/config.toml: the tiny model, the local
engine, the job's retriever, `--share-rollouts` rollouts of 128 episodes) is run, and the rollout worker's trace read:
per episode, the seconds its searches took (each search is a recorded tool call with its duration) against the
episode's own (from its reset to its close); and in all, the searches' seconds against the rollouts' wall time times
the episodes in flight. `--share-rollouts 0` leaves it out.
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


def rollout_share(rollouts: int, tmp: Path) -> dict:
    """Run the tiny search job for `rollouts` rollouts; the retriever's share of its episodes' time."""
    from slime_actors.traces.reader import TraceRun
    run = tmp / "search-run"
    cmd = [str(Path(sys.executable).parent / "slime-actors"), "train", "--config", "examples/search/config.toml",
           "--run-dir", str(run), "--num-rollout", str(rollouts), "--eval-interval", "0",
           "--skip-eval-before-train", "--progress", "false", "--use-tensorboard", "false"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"the search job failed: {res.stderr[-3000:]}")
    starts, ends, search_s = {}, {}, {}
    for e in TraceRun(run).events("rollout/0"):
        if e.ev != "input":
            continue
        key = str((e.extra or {}).get("key") or "")
        if e.name == "env.reset":
            starts[key.rsplit(":", 1)[0]] = e.t_ns
        elif e.name == "env.close":
            ends[key.rsplit(":", 1)[0]] = e.t_ns
        elif e.name == "env.tool":
            body = e.body()
            if isinstance(body, dict) and body.get("tool") == "search":
                ep = key.rsplit(":", 1)[0]
                search_s[ep] = search_s.get(ep, 0.0) + float(body.get("seconds") or 0.0)
    episodes = [ep for ep in starts if ep in ends]
    shares = [search_s.get(ep, 0.0) / max(1e-9, (ends[ep] - starts[ep]) / 1e9) for ep in episodes]
    searching = [ep for ep in episodes if ep in search_s]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    wall = sum(r.get("time/rollout", 0.0) for r in rows)
    return {"episodes": len(episodes), "searching_episodes": len(searching),
            "searches_s": sum(search_s.values()), "episodes_s": sum((ends[e] - starts[e]) / 1e9 for e in episodes),
            "mean_share": statistics.mean(shares) if shares else 0.0,
            "mean_share_searching": statistics.mean(search_s[e] / max(1e-9, (ends[e] - starts[e]) / 1e9)
                                                    for e in searching) if searching else 0.0,
            "rollout_wall_s": wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--people", type=int, nargs="+", default=[300, 20000])
    p.add_argument("--share-rollouts", type=int, default=3, help="rollouts of the search job (0: no share row)")
    ns = p.parse_args()
    share = None
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
        if ns.share_rollouts:
            share = rollout_share(ns.share_rollouts, Path(tmp))
    print(f"retriever (BM25, bm25s), {os.cpu_count()} CPU(s), {ns.seconds:g} s per row, topk 3, return_scores true\n")
    print("| documents | concurrency | questions / request | requests / s | questions / s | p50 ms | p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for docs, conc, per, r in rows:
        print(f"| {docs} | {conc} | {per} | {r['requests/s']:.0f} | {r['queries/s']:.0f} | {r['p50 ms']:.1f} | "
              f"{r['p99 ms']:.1f} |")
    if share is not None:
        print(f"\nthe retriever's share of a rollout (examples/search/config.toml, tiny model, local engine, "
              f"{ns.share_rollouts} rollouts, {share['episodes']} episodes, {share['searching_episodes']} of them "
              "searching):\n")
        print("| searches, s | episodes, s | share of an episode (mean) | share of a searching episode (mean) |")
        print("|---:|---:|---:|---:|")
        print(f"| {share['searches_s']:.2f} | {share['episodes_s']:.1f} | {100 * share['mean_share']:.1f}% | "
              f"{100 * share['mean_share_searching']:.1f}% |")
    print(json.dumps({"rows": [{"docs": d, "concurrency": c, "per_request": p, **r} for d, c, p, r in rows],
                      "share": share}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
