"""What sending a rollout's requests to the engine costs the rollout worker: one /generate per sample (how groups
were sent before 2026-12-06) against one batched /generate per group (SGLang's batch form, what the built-in path
sends now), side by side in one run.

    .venv/bin/python bench/generate_requests.py [--groups 16] [--group 8] [--rounds 15]

The rollout worker's own generation code (actors/rollout_generate.py, `Generation`) sends a rollout of `--groups`
groups of `--group` samples (60-token prompts, a sampling seed each) through the real engine client (aiohttp) to a
stand-in engine in another process: an HTTP server that answers /generate WAIT_S (0.2 s) after a request came, as
an engine answers only once it has generated, for a single prompt or a batch, with 100 tokens and their log-probs
per prompt, and notes when each request arrived. Per mode and round:

    spread        first to last prompt's arrival at the engine: how much later the last request starts generating
                  than the first (on one H100 the 128 requests of a rollout went out over 31-41 ms one by one)
    last arrival  from the worker starting the rollout's groups to the last prompt's arrival
    all answered  from the start to every group having its answers, less the stand-in's WAIT_S: the worker's and
                  the HTTP exchange's own cost, both ways

Medians over `--rounds` rounds (modes alternating within each round; the first round of each is a warm-up and not
counted). The answers must be the same either way (token ids and log-probs per sample), and are checked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOKENS = 100   # the stand-in's answer per prompt
WAIT_S = 0.2   # how long after a request the stand-in answers it


def _answer(ids: list[int], sp: dict) -> dict:
    n = min(TOKENS, sp["max_new_tokens"])
    toks = [(sum(ids) + int(sp.get("sampling_seed", 0)) + k) % 40000 + 5 for k in range(n)]
    return {"output_ids": toks, "meta_info": {
        "id": "r", "finish_reason": {"type": "length", "length": len(toks)}, "prompt_tokens": len(ids),
        "completion_tokens": len(toks), "weight_version": "0",
        "output_token_logprobs": [[-0.001 * (k + 1), t, None] for k, t in enumerate(toks)]}}


def serve(port_q) -> None:
    """The stand-in engine: answers /generate at once; GET /arrivals hands over (and clears) the arrival times."""
    from aiohttp import web
    arrivals: list[float] = []

    async def generate(request):
        body = await request.json()
        ids, sp = body["input_ids"], body["sampling_params"]
        now = time.time()
        batch = bool(ids) and isinstance(ids[0], list)
        arrivals.extend([now] * (len(ids) if batch else 1))
        await asyncio.sleep(WAIT_S)
        return web.json_response([_answer(i, s) for i, s in zip(ids, sp)] if batch else _answer(ids, sp))

    async def take(_request):
        out = list(arrivals)
        arrivals.clear()
        return web.json_response(out)

    async def main():
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/generate", generate)
        app.router.add_get("/arrivals", take)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_q.put(site._server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()
    asyncio.run(main())


def worker(url: str, groups: int):
    from slime_actors.actors.rollout import RolloutWorker
    from slime_actors.backends.engine_client import EngineClient
    from slime_actors.config import parse_config
    from slime_actors.models.tiny import make_tokenizer
    d = tempfile.mkdtemp(prefix="bench-generate-")
    data = os.path.join(d, "p.jsonl")
    with open(data, "w") as f:
        f.write(json.dumps({"input": "1 2 first =", "label": "1"}) + "\n")
    w = RolloutWorker(0, args=parse_config(["--prompt-data", data, "--hf-checkpoint", "tiny:x", "--rm-type",
                                           "exact_match", "--rollout-concurrency", str(groups * 64)]).to_dict())
    w.tokenizer = make_tokenizer()
    w.client = EngineClient(url)
    w._engine_ok = asyncio.Event()
    w._engine_ok.set()
    return w


def make_groups(groups: int, per: int):
    import random

    from slime_actors.types import Sample
    rng = random.Random(0)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(49152) for _ in range(60)]
        out.append([Sample(index=g * per + i, group_index=g, prompt_tokens=list(prompt)) for i in range(per)])
    return out


async def one_round(w, mode: str, groups: int, per: int, url: str, session) -> tuple[dict, list]:
    sp = {"max_new_tokens": 128, "temperature": 1.0}
    todo = make_groups(groups, per)
    gen = w.generation

    async def per_sample(g):   # how a group was generated before: a request per sample
        return await asyncio.gather(*(gen.sample(s, sp, 0) for s in g))

    async def batched(g):
        return await gen.group(g, sp, 0, "train", f"train-{g[0].group_index}")
    run = per_sample if mode == "per sample" else batched
    t0 = time.time()
    done = await asyncio.gather(*(run(g) for g in todo))
    t1 = time.time()
    async with session.get(url + "/arrivals") as r:
        arrivals = sorted(await r.json())
    assert len(arrivals) == groups * per, (mode, len(arrivals))
    answers = [(s.response_tokens, s.rollout_log_probs) for g in done for s in g]
    return {"spread": (arrivals[-1] - arrivals[0]) * 1e3, "last arrival": (arrivals[-1] - t0) * 1e3,
            "all answered": (t1 - t0 - WAIT_S) * 1e3}, answers


async def run(groups: int, per: int, rounds: int, url: str) -> dict:
    import aiohttp
    w = worker(url, groups)
    modes = ("per sample", "one request per group")
    got: dict = {m: [] for m in modes}
    async with aiohttp.ClientSession() as session:
        for r in range(rounds + 1):
            seen = {}
            for m in (modes if r % 2 == 0 else modes[::-1]):
                res, answers = await one_round(w, m, groups, per, url, session)
                seen[m] = answers
                if r:
                    got[m].append(res)
            assert seen[modes[0]] == seen[modes[1]], "the two ways gave different answers"
    await w.client.close()
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=serve, args=(q,), daemon=True)
    p.start()
    try:
        url = f"http://127.0.0.1:{q.get(timeout=60)}"
        got = asyncio.run(run(a.groups, a.group, a.rounds, url))
    finally:
        p.kill()
    print(f"# a rollout of {a.groups} groups x {a.group} samples sent to a stand-in engine that "
          f"answers {WAIT_S} s after each request ({time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}); "
          f"medians of {a.rounds} rounds, ms")
    print("| sent as | spread of the arrivals | last arrival | all answered |")
    print("|---|---:|---:|---:|")
    for mode, rows in got.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"| {mode} | {med['spread']:.1f} | {med['last arrival']:.1f} | {med['all answered']:.1f} |")
    print("(the same token ids and log-probs per sample both ways: checked every round)")


if __name__ == "__main__":
    main()
