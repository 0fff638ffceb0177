"""The code sandbox's cost: programs graded per second at concurrency 1, 8 and 32, beside the same programs run in
a bare subprocess (`python3 main.py`, no isolation), and the reward worker's share of a training run's CPU.

    python bench/sandbox.py                      # the table (about 3 minutes on 2 cores)
    python bench/sandbox.py --programs 100 --concurrency 1 8 --train-steps 0

Two kinds of program, each graded as --rm-type code grades them (slime_actors/rewards/code.py):
  stdio    read two numbers, print their sum; one stdin/stdout case
  assert   a function and three assert tests (the harness: a tester and a solver process in one cell)
The bare subprocess runs the same text: stdio with the input on stdin, its output compared; assert as the program
followed by its tests in one file (the usual unsafe way), exit code 0 = pass. Every program's text differs (a
comment), so none is answered from the grader's cache. CPU is that of this process and its children (the jail
server and everything it forks), per program.

The run: `slime-actors train --config examples/code_synth/config.toml --num-rollout N` in a run directory of its
own; the job's CPU is what its processes used (this process's children), the reward worker's is what it reports
when it stops (itself, its sandbox and its programs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slime_actors.rewards.code import AssertTests, StdioTests, agrade_code  # noqa: E402
from slime_actors.sandbox import Limits, Policy, Runner  # noqa: E402
from slime_actors.sandbox.layers import default_python  # noqa: E402

STDIO = "a, b = map(int, input().split())\nprint(a + b)\n"
STDIO_TESTS = StdioTests(("3 4\n",), ("7\n",))
ASSERT = "def add(a, b):\n    return a + b\n"
ASSERT_TESTS = AssertTests(("assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"))


def cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def sandboxed(kind: str, n: int, conc: int, root: str) -> tuple[float, float, int]:
    runner = Runner(Policy(), Limits(timeout=10, memory_mb=512), concurrency=conc, root=root)
    runner.plan
    prog, tests = (STDIO, STDIO_TESTS) if kind == "stdio" else (ASSERT, ASSERT_TESTS)

    async def go():
        return await asyncio.gather(*(agrade_code(prog + f"# {kind} {i}\n", tests, runner) for i in range(n)))
    asyncio.run(agrade_code(prog + "# warm\n", tests, runner))      # the jail server's start is not timed
    c0, t0 = cpu(), time.monotonic()
    grades = asyncio.run(go())
    wall = time.monotonic() - t0
    runner.close()          # the jail server ends and is reaped: its programs' CPU time counts from here on
    used = cpu() - c0
    return n / wall, used / n, sum(g.score == 1.0 for g in grades)


def bare(kind: str, n: int, conc: int, python: str) -> tuple[float, float, int]:
    d = tempfile.mkdtemp(prefix="bench-bare-")

    def one(i: int) -> bool:
        f = Path(d) / f"p{i}.py"
        if kind == "stdio":
            f.write_text(STDIO + f"# {i}\n")
            r = subprocess.run([python, str(f)], input=b"3 4\n", capture_output=True, timeout=10)
            return r.returncode == 0 and r.stdout.split() == [b"7"]
        f.write_text(ASSERT + f"# {i}\n" + "\n".join(ASSERT_TESTS.tests) + "\n")
        return subprocess.run([python, str(f)], capture_output=True, timeout=10).returncode == 0
    c0, t0 = cpu(), time.monotonic()
    with ThreadPoolExecutor(conc) as ex:
        ok = sum(ex.map(one, range(n)))
    wall, used = time.monotonic() - t0, cpu() - c0
    shutil.rmtree(d, ignore_errors=True)
    return n / wall, used / n, ok


def train_share(steps: int) -> dict:
    run = ROOT / "runs" / "bench_sandbox"
    shutil.rmtree(run, ignore_errors=True)
    c0, t0 = cpu(), time.monotonic()
    r = subprocess.run([sys.executable, "-m", "slime_actors.cli", "train", "--config",
                        str(ROOT / "examples/code_synth/config.toml"), "--num-rollout", str(steps), "--run-dir",
                        str(run), "--eval-interval", "0", "--progress", "false"], capture_output=True, text=True,
                       cwd=ROOT)
    wall, job = time.monotonic() - t0, cpu() - c0
    if r.returncode != 0:
        raise SystemExit(f"the training run failed:\n{r.stderr[-3000:]}")
    reward = None
    for line in (run / "logs" / "reward-0.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev.get("event") == "reward worker cpu":
            reward = ev
    if reward is None:
        raise SystemExit("the reward worker did not report its CPU (logs/reward-0.jsonl)")
    rw = reward["self_s"] + reward["children_s"]
    return {"steps": steps, "wall": wall, "job_cpu": job, "reward_cpu": rw, "sandbox_cpu": reward["children_s"],
            "programs": reward.get("programs")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=200, help="programs per row")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--train-steps", type=int, default=10, help="steps of the training run (0: no run)")
    a = ap.parse_args()
    python = default_python()
    root = tempfile.mkdtemp(prefix="bench-sandbox-")
    os.chmod(root, 0o711)
    print(f"machine: {os.cpu_count()} CPUs; programs run by {python}; {a.programs} programs per row")
    runner = Runner(Policy(), root=root)
    print("sandbox layers: " + "; ".join(runner.plan.describe()))
    print()
    print("| program | concurrency | sandbox: programs/s | bare: programs/s | sandbox cost (bare/sandbox) | "
          "sandbox CPU ms/program | bare CPU ms/program | passed (sandbox, bare) |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in ("stdio", "assert"):
        for c in a.concurrency:
            s_rate, s_cpu, s_ok = sandboxed(kind, a.programs, c, root)
            b_rate, b_cpu, b_ok = bare(kind, a.programs, c, python)
            print(f"| {kind} | {c} | {s_rate:.1f} | {b_rate:.1f} | {b_rate / s_rate:.2f}x | {s_cpu * 1000:.1f} | "
                  f"{b_cpu * 1000:.1f} | {s_ok}/{a.programs}, {b_ok}/{a.programs} |", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    if a.train_steps:
        t = train_share(a.train_steps)
        print()
        print("| training run | steps | wall s | job CPU s | reward worker CPU s (its sandbox) | reward worker share | "
              "programs graded |")
        print("|---|---|---|---|---|---|---|")
        print(f"| examples/code_synth | {t['steps']} | {t['wall']:.0f} | {t['job_cpu']:.0f} | {t['reward_cpu']:.1f} "
              f"({t['sandbox_cpu']:.1f}) | {100 * t['reward_cpu'] / t['job_cpu']:.0f}% | {t['programs']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
