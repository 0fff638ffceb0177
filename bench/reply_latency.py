"""How late an actor reads its replies while an HTTP stream keeps its event loop busy -- the end of a rollout, when
SGLang returns the last responses and the rollout worker asks for each group's score and hands the group in.

    .venv/bin/python bench/reply_latency.py [--rounds 6] [--groups 16] [--group 8] [--every-ms 1.2] [--poll-ms 0.2]
                                            [--window-ms 5]

Three processes: a fake engine (aiohttp: it holds the round's requests, then answers them eight -- `--group` -- at a
time every `--every-ms`, as SGLang did at the end of a rollout on one H200), an echo actor (`score`: 0.8 ms of work,
then a reply; `submit`: 0.25 ms), and a client actor on uvloop that plays the rollout worker: per round, `--groups`
groups of `--group` requests to the engine; each group, once all its answers are in, asks `score` (4 KB) and then
`submit` (12 KB). Both actors trace every message (the default), and the figures come from the traces:

    reply transit   the echo's send of a reply -> the client's receipt of it (the two traces, one clock; the send is
                    stamped once it is done, so a transit can come out a few us below zero)
    tail            the round's last `score` ask sent (its group's answers all read) -> the last `submit` reply
                    read (the client's trace): the end of a rollout as the rollout worker sees it

Two ways, alternating round by round in fresh processes:

    as is           the client's mailbox as it is: a socket is read when its ZMQ_FD wakes the loop, or after a send
    polled          an experiment, not the project's behaviour: for --window-ms after each send the client also
                    checks that socket every --poll-ms (the bench wraps the client's sends; nothing else changes)

What it answers: whether replies sit unread for milliseconds on this machine while the loop is busy
(docs/performance.md, *A step's orchestration, what is left*), and whether checking the socket for a while after a
send changes that.
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

from _procs import actor_process, busy as _busy, held_engine  # noqa: E402

from slime_actors.actors.base import Actor, handler  # noqa: E402
from slime_actors.runtime import RuntimeConfig  # noqa: E402

WAYS = ("as is", "polled")


class Echo(Actor):
    role = "bench"

    @handler
    def score(self, x=None) -> bool:
        _busy(0.0008)
        return True

    @handler
    def submit(self, x=None) -> bool:
        _busy(0.00025)
        return True

    @handler
    def flush(self) -> None:
        """Write out what tracing still holds: the round ends, this process is killed next."""
        if self.tracer is not None:
            self.tracer.flush()


class Client(Actor):
    role = "client"


def _engine(ready, n: int, chunk: int, every: float) -> None:
    """Answers POST /generate: holds requests until `n` are in, then answers them `chunk` at a time every `every`
    seconds, in the order they came."""
    body = json.dumps({"text": "x" * 1200, "meta_info": {"output_token_logprobs": list(range(40))}}).encode()

    async def release(held: list[asyncio.Future]) -> None:
        await asyncio.sleep(0.05)
        for i in range(0, len(held), chunk):
            for f in held[i:i + chunk]:
                f.set_result(None)
            await asyncio.sleep(every)
    held_engine(n, body, release, ready.put)


def _echo(run_dir: str, ready) -> None:
    actor_process(lambda: Echo(0), run_dir, "bench/0", ready.put)


def _polled_sends(every: float, window: float) -> None:
    """The experiment: after each send on a socket to a peer, check that socket every `every` s for `window` s."""
    from slime_actors.mailbox import mailbox as mb
    send = mb.Mailbox._try_send
    until: dict[int, float] = {}

    def poll(sock) -> None:
        if sock.closed or time.monotonic() > until[id(sock)]:
            until.pop(id(sock), None)
            return
        sock.ready()
        sock.loop.call_later(every, poll, sock)

    def try_send(sock, *args, **kw):
        sent = send(sock, *args, **kw)
        if sent and not sock.router:
            first = id(sock) not in until
            until[id(sock)] = time.monotonic() + window
            if first:
                sock.loop.call_later(every, poll, sock)
        return sent
    mb.Mailbox._try_send = staticmethod(try_send)


def _client(run_dir: str, echo: str, port: int, groups: int, group: int, polled: bool, a) -> None:
    import aiohttp
    import uvloop

    from slime_actors.log import setup_logging
    setup_logging(run_dir, "client/0", console=False, level="warning")
    if polled:
        _polled_sends(a.poll_ms / 1e3, a.window_ms / 1e3)

    async def main():
        client = Client(0)
        await client.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers={"bench/0": echo}))
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=groups * group))
        url = f"http://127.0.0.1:{port}/generate"

        async def one() -> None:
            async with session.post(url, data=b"x" * 400) as resp:
                json.loads(await resp.read())

        async def run_group() -> None:
            await asyncio.gather(*(one() for _ in range(group)))
            await client.ask("bench/0", "score", {"x": "s" * 4000})
            await client.ask("bench/0", "submit", {"x": "s" * 12000})
        try:
            await asyncio.gather(*(run_group() for _ in range(groups)))
            await client.ask("bench/0", "flush")
        finally:
            await session.close()
            await client.stop()
    uvloop.run(main())


def _round(polled: bool, a) -> dict:
    """One round in fresh processes: (reply transits in ms, the tail in ms)."""
    from slime_actors.traces.reader import TraceRun
    run_dir = tempfile.mkdtemp(prefix="bench-reply-latency-")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    engine = ctx.Process(target=_engine, args=(q, a.groups * a.group, a.group, a.every_ms / 1e3), daemon=True)
    engine.start()
    port = q.get(timeout=60)
    echo = ctx.Process(target=_echo, args=(run_dir, q), daemon=True)
    echo.start()
    endpoint = q.get(timeout=60)
    client = ctx.Process(target=_client, args=(run_dir, endpoint, port, a.groups, a.group, polled, a))
    client.start()
    client.join(120)
    for p in (client, echo, engine):
        if p.is_alive():
            p.kill()
            p.join()
    if client.exitcode != 0:
        raise SystemExit(f"the client process ended with {client.exitcode} (its log: {run_dir}/logs)")
    tr = TraceRun(run_dir)
    transit = {"score": [], "submit": []}
    for m in tr.messages().values():
        if m.method in transit and m.reply is not None and m.reply_sent is not None:
            transit[m.method].append((m.reply.t_ns - m.reply_sent.t_ns) / 1e6)
    msgs = tr.messages().values()
    submits = [m.reply.t_ns for m in msgs if m.method == "submit" and m.reply is not None]
    scores_sent = [m.send.t_ns for m in msgs if m.method == "score" and m.send is not None]
    if len(submits) != a.groups or sum(map(len, transit.values())) != 2 * a.groups:
        raise SystemExit(f"the traces in {run_dir} do not hold every ask and reply of the round")
    return {"transit": transit, "tail": (max(submits) - max(scores_sent)) / 1e6}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds per way (each in fresh processes)")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group", type=int, default=8, help="requests per group, and answers per release")
    ap.add_argument("--every-ms", type=float, default=1.2, help="the engine's pause between two releases")
    ap.add_argument("--poll-ms", type=float, default=0.2, help="'polled': how often a socket is checked")
    ap.add_argument("--window-ms", type=float, default=5.0, help="'polled': for how long after a send")
    a = ap.parse_args()
    bad = [f"--{k.replace('_', '-')} must be at least 1, got {v}" for k, v in
           (("rounds", a.rounds), ("groups", a.groups), ("group", a.group)) if v < 1]
    bad += [f"--{k.replace('_', '-')} must be above 0, got {v}" for k, v in
            (("every_ms", a.every_ms), ("poll_ms", a.poll_ms), ("window_ms", a.window_ms)) if not v > 0]
    if bad:
        ap.error("; ".join(bad))
    got: dict[str, list[dict]] = {w: [] for w in WAYS}
    for r in range(a.rounds):
        for w in (WAYS if r % 2 == 0 else WAYS[::-1]):
            got[w].append(_round(w == "polled", a))
            print(f"round {r + 1}/{a.rounds} {w}: tail {got[w][-1]['tail']:.1f} ms", file=sys.stderr, flush=True)
    print(f"# reply latency under an HTTP stream ({time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs): {a.groups} groups of {a.group}, answers released {a.group} every "
          f"{a.every_ms} ms; 'polled' checks a socket every {a.poll_ms} ms for {a.window_ms} ms after a send")
    print(f"| way | score reply transit, ms (median / p90 / max) | submit reply transit, ms (median / p90 / max) "
          f"| tail, ms (median of {a.rounds} rounds; range) |")
    print("|---|---:|---:|---:|")
    for w in WAYS:
        rows = got[w]
        cells = []
        for method in ("score", "submit"):
            xs = [x for r in rows for x in r["transit"][method]]
            cells.append(f"{statistics.median(xs):.2f} / {_pct(xs, 0.9):.2f} / {max(xs):.2f}")
        tails = [r["tail"] for r in rows]
        print(f"| {w} | {cells[0]} | {cells[1]} | {statistics.median(tails):.1f} ({min(tails):.1f}-{max(tails):.1f}) |")


if __name__ == "__main__":
    main()
