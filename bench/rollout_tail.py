"""The end of a rollout on this machine's CPUs: the engine's last answers come back together, and the rollout worker
parses each, sends it to scoring and hands the group in -- with /generate answers parsed one per turn of its event
loop (the engine client as it is: slime_actors/loop_turns.py) and all in one turn (as before it).

    .venv/bin/python bench/rollout_tail.py [--rounds 6] [--groups 16] [--burst 8] [--every-ms 3] [--group 8]
                                           [--tokens 128] [--work-ms 0.45] [--score-ms 0.8] [--submit-ms 0.6]

Four processes per round, fresh each round:

    engine    aiohttp, holding every group's batched /generate until all are in; then it answers them one group
              every --every-ms, and the last --burst groups at once (SGLang's last responses stop together), each
              answer as SGLang writes it (--group responses of --tokens ids with their log-prob triples)
    worker    an actor on uvloop playing the rollout worker, with the project's EngineClient: per group one batched
              /generate; the answer parsed (parse_generate_output), --work-ms of CPU (recording it, the episodes,
              decoding: ~0.45 ms a group on one H100's host), `score` asked of the reward, then `submit` of the buffer
    reward    an actor: `score` is --score-ms of work
    buffer    an actor: `submit` is --submit-ms of work (a group of 8 x 190 tokens handed in: ~0.6 ms on the 2-vCPU VM,
              bench/buffer_step.py)

Two ways, alternating round by round: `turns` (the client as it is) and `one turn` (its answer turns replaced by
ones that never wait: every answer ready together is handled in the turn it is read). Per round, in ms after the
engine let the last group go (time.monotonic, one clock for the processes of one machine):

    scored     the last score ask sent (every group parsed and worked on)
    tail       the last submit's reply read: the rollout handed in, what the step waits for
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _procs import actor_process, busy as _busy, held_engine  # noqa: E402

from slime_actors.actors.base import Actor, handler  # noqa: E402
from slime_actors.runtime import RuntimeConfig  # noqa: E402

WAYS = ("turns", "one turn")


class Reward(Actor):
    role = "bench_reward"   # (not the project's roles: their messages' fields are declared, messages.py)
    work = 0.0

    @handler
    def score(self, samples=None) -> list:
        _busy(self.work)
        return [1.0] * len(samples or [])


class Buffer(Actor):
    role = "bench_buffer"
    work = 0.0

    @handler
    def submit(self, samples=None) -> bool:
        _busy(self.work)
        return True


class Worker(Actor):
    role = "bench_rollout"


def _answer(group: int, tokens: int, rng: random.Random) -> bytes:
    out = []
    for k in range(group):
        ids = [rng.randrange(49152) for _ in range(tokens)]
        out.append({"output_ids": ids, "meta_info": {
            "id": f"{k:032x}", "finish_reason": {"type": "length", "length": tokens}, "prompt_tokens": 55,
            "weight_version": "3", "completion_tokens": tokens, "cached_tokens": 48, "e2e_latency": 0.61,
            "output_token_logprobs": [[-rng.random() * 3, i, None] for i in ids],
            "input_token_logprobs": [[None, 1, None]], "output_top_logprobs": [], "input_top_logprobs": []}})
    return json.dumps(out).encode()


def _engine(q, a) -> None:
    """Answers POST /generate: holds the round's requests until all are in, then lets them go one every --every-ms
    and the last --burst together; puts the monotonic time of that last release on `q`."""
    async def release(held: list[asyncio.Future]) -> None:
        await asyncio.sleep(0.05)
        cut = max(0, len(held) - a.burst)
        for f in held[:cut]:
            f.set_result(None)
            await asyncio.sleep(a.every_ms / 1e3)
        for f in held[cut:]:
            f.set_result(None)
        q.put(("released", time.monotonic()))
    held_engine(a.groups, _answer(a.group, a.tokens, random.Random(0)), release, lambda port: q.put(("port", port)))


def _actor(cls, work: float, run_dir: str, q) -> None:
    cls.work = work
    actor_process(lambda: cls(0), run_dir, f"{cls.role}/0", lambda endpoint: q.put((cls.role, endpoint)),
                  trace=False)


class _NoTurns:
    """The engine client before its answer turns: every answer is handled in the turn it is read."""
    taken = waited = 0

    async def take(self) -> None:
        return None


def _worker(run_dir: str, peers: dict, port: int, turns: bool, a, q) -> None:
    import uvloop

    from slime_actors.backends.engine_client import EngineClient, parse_generate_output
    from slime_actors.log import setup_logging
    setup_logging(run_dir, "bench_rollout/0", console=False, level="warning")
    score_body = [{"response": "x" * 400, "label": "83"} for _ in range(a.group)]
    submit_body = [{"response_tokens": list(range(a.tokens)), "rollout_log_probs": [-0.5] * a.tokens,
                    "loss_mask": [1] * a.tokens, "response": "x" * 400} for _ in range(a.group)]

    async def main():
        worker = Worker(0)
        await worker.start(RuntimeConfig(run_dir=run_dir, curve=False, trace=False, static_peers=peers))
        client = EngineClient(f"http://127.0.0.1:{port}", timeout=60, max_concurrency=a.groups)
        if not turns:
            client.answer_turns = _NoTurns()   # type: ignore[assignment]
        scored: list[float] = []
        done: list[float] = []

        async def group() -> None:
            answers = await client.generate([[1, 2, 3]] * a.group, {"max_new_tokens": a.tokens})
            outs = [parse_generate_output(r) for r in answers]
            assert len(outs) == a.group and len(outs[0].output_ids) == a.tokens
            _busy(a.work_ms / 1e3)
            scored.append(time.monotonic())
            await worker.ask("bench_reward/0", "score", {"samples": score_body})
            await worker.ask("bench_buffer/0", "submit", {"samples": submit_body})
            done.append(time.monotonic())
        try:
            await asyncio.gather(*(group() for _ in range(a.groups)))
        finally:
            await client.close()
            await worker.stop()
        q.put(("worker", max(scored), max(done), client.answer_turns.waited))
    uvloop.run(main())


def _round(turns: bool, a) -> dict:
    """One round in fresh processes: ms from the last release to the last score ask and to the last submit's reply."""
    run_dir = tempfile.mkdtemp(prefix="bench-rollout-tail-")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_engine, args=(q, a), daemon=True),
             ctx.Process(target=_actor, args=(Reward, a.score_ms / 1e3, run_dir, q), daemon=True),
             ctx.Process(target=_actor, args=(Buffer, a.submit_ms / 1e3, run_dir, q), daemon=True)]
    for p in procs:
        p.start()
    got: dict = {}
    while len(got) < 3:
        k, v = q.get(timeout=60)
        got[k] = v
    peers = {"bench_reward/0": got["bench_reward"], "bench_buffer/0": got["bench_buffer"]}
    worker = ctx.Process(target=_worker, args=(run_dir, peers, got["port"], turns, a, q))
    worker.start()
    try:
        for _ in range(2):
            item = q.get(timeout=120)
            got[item[0]] = item[1:]
    finally:
        worker.join(30)
        for p in (worker, *procs):
            if p.is_alive():
                p.kill()
                p.join()
    if "worker" not in got or worker.exitcode != 0:
        raise SystemExit(f"the worker process ended with {worker.exitcode} (its log: {run_dir}/logs)")
    released = got["released"][0]
    scored, done, waited = got["worker"]
    return {"scored": (scored - released) * 1e3, "tail": (done - released) * 1e3, "waited": waited}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds per way (each in fresh processes)")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--burst", type=int, default=8, help="the last groups answered together")
    ap.add_argument("--every-ms", type=float, default=3.0, help="between two of the groups answered before them")
    ap.add_argument("--group", type=int, default=8, help="responses a group")
    ap.add_argument("--tokens", type=int, default=128, help="tokens a response")
    ap.add_argument("--work-ms", type=float, default=0.45, help="the worker's CPU a group after the parse")
    ap.add_argument("--score-ms", type=float, default=0.8, help="the reward's CPU a score ask")
    ap.add_argument("--submit-ms", type=float, default=0.6, help="the buffer's CPU a submit")
    a = ap.parse_args(argv)
    bad = [f"--{k.replace('_', '-')} must be at least 1, got {v}" for k, v in
           (("rounds", a.rounds), ("groups", a.groups), ("burst", a.burst), ("group", a.group),
            ("tokens", a.tokens)) if v < 1]
    bad += [f"--{k.replace('_', '-')} must be 0 or more, got {v}" for k, v in
            (("every_ms", a.every_ms), ("work_ms", a.work_ms), ("score_ms", a.score_ms),
             ("submit_ms", a.submit_ms)) if not v >= 0]
    if a.burst > a.groups:
        bad.append(f"--burst {a.burst} is more than --groups {a.groups}")
    if bad:
        ap.error("; ".join(bad))
    got: dict[str, list[dict]] = {w: [] for w in WAYS}
    for r in range(a.rounds):
        for w in (WAYS if r % 2 == 0 else WAYS[::-1]):
            got[w].append(_round(w == "turns", a))
            print(f"round {r + 1}/{a.rounds} {w}: tail {got[w][-1]['tail']:.1f} ms", file=sys.stderr, flush=True)
    print(f"# the end of a rollout ({time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.machine()}, {os.cpu_count()} "
          f"CPUs): {a.groups} groups of {a.group} x {a.tokens} tokens, the last {a.burst} answered together; "
          f"worker {a.work_ms} ms a group after its parse, score {a.score_ms} ms, submit {a.submit_ms} ms")
    print("| way | last score ask sent, ms after the last answer (median; range) | rollout handed in: last submit "
          "answered, ms (median; range) | answers that waited for a turn (median) |")
    print("|---|---:|---:|---:|")
    for w in WAYS:
        rows = got[w]
        cells = []
        for key in ("scored", "tail"):
            xs = [r[key] for r in rows]
            cells.append(f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})")
        print(f"| {w} | {cells[0]} | {cells[1]} | {statistics.median(r['waited'] for r in rows):.0f} |")


if __name__ == "__main__":
    main()
