"""What the mailbox's malloc settings cost in memory (slime_actors/mailbox/allocator.py): an echo actor's RSS.

    .venv/bin/python bench/allocator_rss.py

An echo actor (traced, in a process of its own) answers asks carrying float32 arrays of random sizes between 1 and
30 MiB, then only small asks; its resident set is read from /proc before, after the arrays (and its peak), and after
the small ones. The same runs with `malloc_keep_mib` 0 (glibc's defaults) and with the default, alternating. Linux
only (it reads /proc/PID/status).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mailbox import BenchClient, BenchEcho  # noqa: E402  (bench/mailbox.py)

from slime_actors.mailbox.mailbox import MailboxConfig  # noqa: E402
from slime_actors.runtime import RuntimeConfig  # noqa: E402


def _config(run_dir: str, keep: int, **kw) -> RuntimeConfig:
    return RuntimeConfig(run_dir=run_dir, curve=False, trace=True, mailbox=MailboxConfig(malloc_keep_mib=keep), **kw)


def _server(run_dir: str, keep: int, ready) -> None:
    import uvloop

    from slime_actors.log import setup_logging
    setup_logging(run_dir, "bench/0", console=False, level="warning")

    async def main():
        actor = BenchEcho(0)
        await actor.start(_config(run_dir, keep))
        ready.put((actor.endpoint, os.getpid()))
        await asyncio.Event().wait()
    uvloop.run(main())


def _rss_mib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in MiB."""
    with open(f"/proc/{pid}/status") as f:
        d = dict(line.split(":", 1) for line in f)
    return int(d["VmRSS"].split()[0]) // 1024, int(d["VmHWM"].split()[0]) // 1024


async def _drive(run_dir: str, endpoint: str, pid: int, keep: int, arrays: int, seed: int) -> tuple:
    client = BenchClient(0)
    await client.start(_config(run_dir, keep, static_peers={"bench/0": endpoint}))
    try:
        start = _rss_mib(pid)[0]
        rng = np.random.default_rng(seed)
        for _ in range(arrays):
            n = int(rng.integers(1 << 18, 30 << 18))  # float32s: 1-30 MiB
            out = await client.ask("bench/0", "echo", {"x": np.ones(n, np.float32)})
            if out.shape != (n,):
                raise AssertionError("the echo came back with another shape")
        busy, peak = _rss_mib(pid)
        await asyncio.sleep(1.0)
        for i in range(50):
            await client.ask("bench/0", "echo", {"x": i})
        return start, busy, peak, _rss_mib(pid)[0]
    finally:
        await client.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arrays", type=int, default=200, help="array echoes per run")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each setting, alternating")
    args = ap.parse_args(argv)
    import uvloop
    ctx = mp.get_context("spawn")
    keep_default = MailboxConfig().malloc_keep_mib
    rows = []
    for r in range(args.repeats):
        for keep in (0, keep_default):
            run_dir = tempfile.mkdtemp(prefix="slime-rss-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
            ready = ctx.Queue()
            proc = ctx.Process(target=_server, args=(run_dir, keep, ready), daemon=True)
            proc.start()
            try:
                endpoint, pid = ready.get(timeout=120)
                rows.append((keep, *uvloop.run(_drive(run_dir, endpoint, pid, keep, args.arrays, seed=r))))
            finally:
                proc.kill()
                proc.join()
    print(f"command: {' '.join(['.venv/bin/python'] + sys.argv)}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs")
    print()
    print(f"| malloc_keep_mib | RSS at start (MiB) | after {args.arrays} echoes of 1-30 MiB | peak | after 1 s idle "
          "and 50 small asks |")
    print("|---:|---:|---:|---:|---:|")
    for keep, start, busy, peak, after in rows:
        print(f"| {keep}{' (glibc defaults)' if keep == 0 else ' (default)'} | {start} | {busy} | {peak} | {after} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
