"""Does asking a process for its stacks leave it running? faulthandler's dump (SIGUSR1) and the one from Python
(SIGUSR2, `slime-actors stacks`' default), side by side in one run.

    .venv/bin/python bench/stack_dumps.py [--tries 5] [--asks 100] [--threads 4]

Each try starts a process that registers both dumps as every actor does (`launch.stacks.register`) and then keeps
`--threads` short-lived threads running Python code at a time (a pool's short tasks: threads start and end all the
time), and sends it up to `--asks` dumps 20 ms apart, for each way of asking in turn. faulthandler writes its dump from
the C signal handler while the other threads run on, which can crash the process when a thread starts or ends
meanwhile (CPython gh-116008); the dump from Python reads every thread's frames with the GIL held. Prints how many
processes died (and by which signal), and after how many asks. docs/debugging.md, *A process that stops answering*,
has the numbers.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.cmdline import command_line  # noqa: E402

CHURN = '''
import sys, threading, time, typing
from slime_actors.launch import stacks
stacks.register()

def task():
    for _ in range(50):
        typing.Union[int, str, bytes]

def churn(n):
    while True:
        ts = [threading.Thread(target=task) for _ in range(n)]
        for t in ts: t.start()
        for t in ts: t.join()

threading.Thread(target=churn, args=(int(sys.argv[1]),), daemon=True).start()
print("ready", flush=True)
while True:
    time.sleep(0.01)
'''


def one_try(script: Path, sig: int, asks: int, threads: int, log: Path) -> tuple[int | None, int]:
    """(the process's exit code if it died, else None; the asks sent)."""
    from slime_actors.launch import stacks
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log, "wb") as err:
        p = subprocess.Popen([sys.executable, str(script), str(threads)], stdout=subprocess.PIPE, stderr=err, env=env)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        sent = 0
        for _ in range(asks):
            if p.poll() is not None:
                break
            stacks.ask(p.pid, sig)
            sent += 1
            time.sleep(0.02)
        time.sleep(0.2)
        return p.poll(), sent
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--asks", type=int, default=100)
    ap.add_argument("--threads", type=int, default=4, help="short-lived threads at a time")
    a = ap.parse_args()
    from slime_actors.launch import stacks
    work = Path(tempfile.mkdtemp(prefix="stack-dumps-"))
    script = work / "churn.py"
    script.write_text(CHURN)
    ways = [("faulthandler (SIGUSR1, `--native`)", stacks.SIGNAL), ("from Python (SIGUSR2, the default)",
                                                                      stacks.LIVE_SIGNAL)]
    rows = []
    for name, sig in ways:
        died, sent_all, after = 0, 0, []
        how: set[str] = set()
        for t in range(a.tries):
            rc, sent = one_try(script, sig, a.asks, a.threads, work / f"err-{int(sig)}-{t}.log")
            sent_all += sent
            if rc is not None:
                died += 1
                after.append(sent)
                how.add(signal.Signals(-rc).name if rc < 0 else f"exit {rc}")
            print(f"{name}, try {t}: {'died (' + str(rc) + ')' if rc is not None else 'alive'} after {sent} asks",
                  file=sys.stderr, flush=True)
        rows.append((name, died, sent_all, after, how))
    print(f"# asking for stacks ({time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}; {a.threads} short-lived threads at a time)")
    print(f"command: {command_line()}")
    print()
    print("| dump | processes that died | asks sent | died after (asks) | by |")
    print("|---|---:|---:|---|---|")
    for name, died, sent_all, after, how in rows:
        print(f"| {name} | {died} of {a.tries} | {sent_all} | {', '.join(map(str, after)) or '-'} | "
              f"{', '.join(sorted(how)) or '-'} |")


if __name__ == "__main__":
    main()
