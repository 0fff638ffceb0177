"""What the buffer's part of one training step costs on this machine's CPU: its handlers driven directly, one
rollout after another, with the bodies of a real run's size.

    .venv/bin/python bench/buffer_step.py [--prompts FILE --chat] [--groups 16] [--group 8] [--tokens 190] [--steps 10]
                                          [--filtered 0.5]

Per step: `start_rollout` (the rollout's groups made from the next prompts), `get_work` (all of them leased to one
worker), a `submit` per group (each sample answered with `--tokens` random token ids and float64 log-probs, as a
rollout worker hands it in: its body decoded as the mailbox decodes it before the handler runs) and a turn of the
event loop after it (what the buffer does meanwhile in a run, while the engines generate: the group's packed
columns for the shard), `wait_rollout`,
`get_batch` (the trainer's shard: the whole rollout, packed as the trainer asks for it), the batch's body encoded and
decoded as the mailbox does on each side (the RL update then makes its tensors: not measured here), and
`mark_trained`. `--filtered F`: a share F of the groups handed in with one reward for all their samples and the
dynamic sampling filter on, which drops them (new groups are made until the rollout is complete): what the buffer
keeps after the steps -- its groups, its snapshot's size and packing time -- is printed after the table. The
buffer writes its log as in a run (RUN_DIR/buffer). Milliseconds per step, mean
over `--steps` steps after two warm-up steps, and per call where a step makes several. No messages, sockets or other
processes: what it measures is the handlers' own work and the codec's, which sit on a step's critical path between
generation and training (docs/performance.md, *A step's orchestration*).

Then `--burst N` more steps in which the rollout's last N groups are handed in together, as at the end of a rollout on
a GPU (SGLang returns them within a few ms; one drain of the buffer's socket runs their submits back to back), with
the controller's wait_rollout and a trainer rank's wait_batch (the shard asked for ahead) waiting: how many ms after
the last of those submits each is answered. wait_rollout's reply starts the trainers; the shard must be at the rank
when the controller's `train` arrives.

By default the prompts are made here (plain text, 55 tokens); `--prompts FILE --chat` reads a JSONL file with a
`messages` key (chat prompts, rendered with the model's template) and a `label` key, like the GPU comparison's
(`scripts/compare_trl.sh` writes runs/compare_trl/data/train.jsonl).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PARTS = ("start_rollout", "get_work", "submit", "a turn after a submit", "wait_rollout", "get_batch", "encode batch",
         "decode batch", "mark_trained")


def _prompts(d: str) -> str:
    path = os.path.join(d, "prompts.jsonl")
    with open(path, "w") as f:
        for i in range(2000):
            f.write(json.dumps({"input": " ".join(str((i * 7 + k) % 10) for k in range(55)), "label": str(i % 10)})
                    + "\n")
    return path


def _answered(group: dict, rng: random.Random, tokens: int, filtered: float = 0.0) -> list[dict]:
    out = []
    same = rng.random() < filtered   # (every sample the same reward: the filter drops the group)
    for j, s in enumerate(group["samples"]):
        s = dict(s)
        s["response_tokens"] = [rng.randrange(49152) for _ in range(tokens)]
        s["loss_mask"] = [1] * tokens
        s["rollout_log_probs"] = [-rng.expovariate(2.0) for _ in range(tokens)]
        s["response"] = "x" * (4 * tokens)
        reward = 0.0 if same else float(j == 0 or rng.random() < 0.4)
        s["reward"], s["status"], s["weight_version"] = reward, "completed", 0
        out.append(s)
    return out


def _handler_fns(buffer) -> dict:
    """The buffer's handlers the steps drive, called directly (no messages)."""
    return {m: type(buffer)._handlers[m].fn for m in ("start_rollout", "get_work", "submit", "wait_rollout",
                                                       "wait_batch", "get_batch", "mark_trained")}


async def _steps(buffer, n: int, groups: int, tokens: int, rng: random.Random, filtered: float = 0.0) -> list[dict]:
    from slime_actors.mailbox.codec import decode_body, encode_body
    handler = _handler_fns(buffer)
    out = []
    for k in range(n):
        t: dict[str, list[float]] = {p: [] for p in PARTS}

        def timed(part: str, t0: float) -> None:
            t[part].append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        await handler["start_rollout"](buffer, rollout_id=k)
        timed("start_rollout", t0)
        t0 = time.perf_counter()
        work = await handler["get_work"](buffer, worker="rollout/0", max_groups=groups)
        timed("get_work", t0)
        bodies: list[bytes] = []
        while work["groups"]:   # (with --filtered, the groups made in place of those the filter dropped, until done)
            more = [encode_body({"worker": "rollout/0", "work_id": g["work_id"],
                                 "samples": _answered(g, rng, tokens, filtered)})[0] for g in work["groups"]]
            for body in more:
                t0 = time.perf_counter()
                await handler["submit"](buffer, **decode_body(body, []))
                timed("submit", t0)
                t0 = time.perf_counter()   # (what the buffer does between two submits, as in a run: pack the group's
                await asyncio.sleep(0)     # columns for the shard, wake the waiters)
                timed("a turn after a submit", t0)
            bodies += more
            work = await handler["get_work"](buffer, worker="rollout/0", max_groups=groups)
        t0 = time.perf_counter()
        await handler["wait_rollout"](buffer, rollout_id=k, hack=False)
        timed("wait_rollout", t0)
        t0 = time.perf_counter()
        batch = await handler["get_batch"](buffer, rollout_id=k, rank=0, world_size=1, packed=True)
        timed("get_batch", t0)
        t0 = time.perf_counter()
        body = encode_body(batch)[0]
        timed("encode batch", t0)
        t0 = time.perf_counter()
        decode_body(body, [])
        timed("decode batch", t0)
        t0 = time.perf_counter()
        await handler["mark_trained"](buffer, rollout_id=k)
        timed("mark_trained", t0)
        out.append({"parts": t, "batch_bytes": len(body), "submit_bytes": statistics.fmean(map(len, bodies))})
    return out


async def _burst_steps(buffer, first: int, n: int, groups: int, burst: int, tokens: int,
                       rng: random.Random) -> list[tuple[float, float]]:
    """`n` steps whose last `burst` groups are handed in together: (ms from the last of their submits to
    wait_rollout's answer, to a rank's wait_batch answer) per step."""
    from slime_actors.mailbox.codec import decode_body, encode_body
    handler = _handler_fns(buffer)
    out = []

    async def answered(call) -> float:
        await call
        return time.perf_counter()   # (in the handler's own turn of the loop, where the mailbox sends its reply)
    for k in range(first, first + n):
        shard = asyncio.ensure_future(answered(handler["wait_batch"](buffer, rollout_id=k, rank=0, world_size=1,
                                                                      packed=True)))
        await handler["start_rollout"](buffer, rollout_id=k)
        work = await handler["get_work"](buffer, worker="rollout/0", max_groups=groups)
        bodies = [encode_body({"worker": "rollout/0", "work_id": g["work_id"],
                               "samples": _answered(g, rng, tokens, 0.0)})[0] for g in work["groups"]]
        cut = max(0, len(bodies) - burst)
        for body in bodies[:cut]:   # (during generation: a turn of the loop after each, as in the steps above)
            await handler["submit"](buffer, **decode_body(body, []))
            await asyncio.sleep(0)
        reported = asyncio.ensure_future(answered(handler["wait_rollout"](buffer, rollout_id=k, hack=False)))
        await asyncio.sleep(0)
        last = [0.0]

        async def submit(body: bytes) -> None:
            await handler["submit"](buffer, **decode_body(body, []))
            last[0] = time.perf_counter()
        await asyncio.gather(*(submit(b) for b in bodies[cut:]))
        t_reported, t_shard = await reported, await shard
        await handler["mark_trained"](buffer, rollout_id=k)
        out.append(((t_reported - last[0]) * 1e3, (t_shard - last[0]) * 1e3))
    return out


def _kept(buffer) -> str:
    """What the buffer holds after the steps: its groups, and its snapshot's size and the time to pack it (done on
    its event loop at each compaction and save)."""
    import msgpack
    t0 = time.perf_counter()
    snap = msgpack.packb(buffer.state.snapshot(), use_bin_type=True)
    ms = (time.perf_counter() - t0) * 1e3
    return (f"after the steps the buffer holds {len(buffer.state.groups):,} groups; its snapshot is "
            f"{len(snap) / 2**10:,.0f} KiB, packed in {ms:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default=None, help="a JSONL prompt file (default: plain prompts made here)")
    ap.add_argument("--chat", action="store_true", help="--prompts holds chat messages under `messages`")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=190, help="response tokens a sample")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--burst", type=int, default=12,
                    help="then --steps steps whose last BURST groups are handed in together (0: none)")
    ap.add_argument("--filtered", type=float, default=0.0,
                    help="share of groups whose samples all get the same reward, with the dynamic sampling filter "
                         "check_reward_nonzero_std on (it drops them; new groups are made until the rollout is "
                         "complete), as in a DAPO-style job")
    a = ap.parse_args()
    bad = [f"--{k} must be at least 1, got {v}" for k, v in (("groups", a.groups), ("group", a.group),
                                                              ("tokens", a.tokens), ("steps", a.steps)) if v < 1]
    if a.burst < 0:
        bad.append(f"--burst must be 0 or more, got {a.burst}")
    if not 0.0 <= a.filtered < 1.0:
        bad.append(f"--filtered must be in [0, 1), got {a.filtered}")
    if a.chat and not a.prompts:
        bad.append("--chat reads --prompts FILE: give one")
    if a.prompts and not os.path.isfile(a.prompts):
        bad.append(f"--prompts {a.prompts}: no such file")
    if bad:
        ap.error("; ".join(bad))

    from slime_actors.actors.buffer import Buffer
    from slime_actors.config import parse_config
    from slime_actors.models.tiny import make_tiny_model
    from slime_actors.runtime import RuntimeConfig
    d = tempfile.mkdtemp(prefix="bench-buffer-step-")
    keys = ["--input-key", "messages", "--label-key", "label", "--apply-chat-template"] if a.chat else \
        ["--input-key", "input", "--label-key", "label"]
    args = parse_config(["--prompt-data", a.prompts or _prompts(d), "--hf-checkpoint",
                         str(make_tiny_model(os.path.join(d, "model"))), "--rm-type", "exact_match",
                         "--rollout-batch-size", str(a.groups), "--n-samples-per-prompt", str(a.group),
                         "--hack-alarms", "off", *keys,
                         *(["--dynamic-sampling-filter-path", "slime_actors.filters.check_reward_nonzero_std"]
                           if a.filtered else [])]).to_dict()

    async def run() -> list[dict]:
        buffer = Buffer(0, args=args)
        await buffer.start(RuntimeConfig(run_dir=os.path.join(d, "run"), curve=False, trace=False))
        try:
            steps = (await _steps(buffer, a.steps + 2, a.groups, a.tokens, random.Random(0), a.filtered))[2:]
            kept.append(_kept(buffer))
            if a.burst:
                bursts.extend(await _burst_steps(buffer, a.steps + 2, a.steps, a.groups, a.burst, a.tokens,
                                                 random.Random(1)))
            return steps
        finally:
            await buffer.stop()
    kept: list[str] = []
    bursts: list[tuple[float, float]] = []
    steps = asyncio.run(run())
    print(f"# the buffer's part of a step ({time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs): {a.groups} groups of {a.group}, {a.tokens} response tokens a sample, "
          f"{'chat prompts from ' + a.prompts if a.chat else (a.prompts or 'plain prompts')}; batch "
          f"{steps[0]['batch_bytes']:,} bytes, a submit {steps[0]['submit_bytes']:,.0f} bytes")
    print(f"| part | ms per step (mean of {len(steps)}) | calls per step | ms per call (median) |")
    print("|---|---:|---:|---:|")
    total = 0.0
    for p in PARTS:
        per_step = statistics.fmean(sum(s["parts"][p]) for s in steps)
        calls = [x for s in steps for x in s["parts"][p]]
        total += per_step
        print(f"| {p} | {per_step:.2f} | {len(calls) // len(steps)} | {statistics.median(calls):.3f} |")
    print(f"| in all | {total:.2f} | | |")
    print(f"\n{kept[0]}" if kept else "")
    if bursts:
        print(f"\n| the rollout's last {min(a.burst, a.groups)} groups handed in together | ms after the last of their "
              f"submits (median of {len(bursts)}) |")
        print("|---|---:|")
        print(f"| wait_rollout answered (the controller: the trainers start) | "
              f"{statistics.median(r for r, _ in bursts):.2f} |")
        print(f"| a rank's shard answered (wait_batch, asked ahead) | {statistics.median(b for _, b in bursts):.2f} |")


if __name__ == "__main__":
    main()
