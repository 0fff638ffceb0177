"""What profiling costs a training step: off (the default), and on (--use-pytorch-profiler), side by side.

    .venv/bin/python bench/profile_cost.py [--steps 20] [--model tiny|smollm2]

The trainer's RL update of one rollout of the digits job (128 samples; or 16 of SmolLM2-135M with --model smollm2)
on the torch backend, in this process, as trainer/0 runs it (TrainerRank._update's path: TrainProfiler.phase around
rl_update):

    no profiler     rl_update called directly (what the code did before profiling existed)
    profiling off   through TrainProfiler with --use-pytorch-profiler off (the default): one attribute test a phase
    profiling on    the rollout profiled: torch profiler with shapes, memory and flops, the clock mark; the step's
                    time without writing the trace, and the export (gzip'd Chrome trace) on its own

Each row: median step time over --steps steps (after 2 warm-up steps), and its ratio to "no profiler". The numbers in
docs/performance.md came from it; the machine is named in its output.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def job(model: str, tmp: Path):
    from slime_actors.config import parse_config
    ckpt = "tiny:digits" if model == "tiny" else "smollm2:135m"
    from slime_actors.models.resolve import resolve_checkpoint
    path = resolve_checkpoint(ckpt, tmp / "models")
    n = 128 if model == "tiny" else 16
    return parse_config(["--hf-checkpoint", path, "--prompt-data", str(ROOT / "examples/digits/train.jsonl"),
                         "--rm-type", "exact_match", "--run-dir", str(tmp / "run"), "--rollout-batch-size",
                         str(n // 8), "--n-samples-per-prompt", "8", "--global-batch-size", str(n),
                         "--micro-batch-size", str(n), "--advantage-estimator", "grpo"]), n


def batch(n: int, seed: int = 0) -> dict:
    import random
    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(3, 13) for _ in range(3)] + [23, 16] for _ in range(n)]
    responses = [[rng.randrange(3, 13)] for _ in range(n)]
    return {"sample_index": list(range(n)), "group_index": [i // 8 for i in range(n)],
            "tokens": [p + r for p, r in zip(prompts, responses)], "prompt_lengths": [len(p) for p in prompts],
            "response_lengths": [1] * n, "loss_masks": [[1]] * n, "rollout_log_probs": [[] for _ in range(n)],
            "rewards": [float(rng.random() < 0.3) for _ in range(n)], "weight_versions": [0] * n}


def debug(on: bool):
    return SimpleNamespace(use_pytorch_profiler=on, record_memory_history=False, profile_ranks=None,
                           profile_step_start=0, profile_step_end=10**9, profile_target=None,
                           memory_snapshot_path="snapshot.pickle", memory_snapshot_dir=None,
                           memory_snapshot_num_steps=None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = p.parse_args()
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)

    from slime_actors.backends.rl_update import rl_update
    from slime_actors.backends.torch_backend import TorchBackend
    from slime_actors.profiler import TrainProfiler
    tmp = Path(tempfile.mkdtemp(prefix="profile-cost-"))
    cfg, n = job(a.model, tmp)
    backend = TorchBackend(cfg, 0, 1)
    backend.init()
    off = TrainProfiler(debug(False), 0, tmp / "off", "trainer/0")
    on = TrainProfiler(debug(True), 0, tmp / "on", "trainer/0")
    exports: list[float] = []
    orig = on._export

    def timed_export(*args):
        t = time.perf_counter()
        orig(*args)
        exports.append(time.perf_counter() - t)
    on._export = timed_export

    def through(prof):
        def step(i):
            with prof.phase("train_overall", i, "m"):
                rl_update(backend, cfg, batch(n, i), i, phase=lambda t: prof.phase(t, i, "m"))
        return step
    modes = {"no profiler": lambda i: rl_update(backend, cfg, batch(n, i), i),
             "profiling off": through(off), "profiling on": through(on)}
    times: dict[str, list[float]] = {k: [] for k in modes}
    for i in range(a.steps + 2):  # the modes take turns, so that a change of the machine's load hits all alike
        order = list(modes)[i % 3:] + list(modes)[:i % 3]
        for name in order:
            t = time.perf_counter()
            modes[name](i)
            if i >= 2:
                times[name].append(time.perf_counter() - t)
    rows = {k: statistics.median(v) for k, v in times.items()}
    export = statistics.median(exports[2:]) if len(exports) > 2 else statistics.median(exports)
    rows["profiling on, without the export"] = rows["profiling on"] - export
    size = statistics.median(f.stat().st_size for f in on.written) / 2**10
    base = rows["no profiler"]
    print(f"the RL update of one rollout ({n} samples, {a.model} model), {a.steps} steps; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'':36} {'median step':>12} {'ratio':>7}")
    for name in ("no profiler", "profiling off", "profiling on, without the export", "profiling on"):
        print(f"{name:36} {rows[name] * 1e3:9.2f} ms {rows[name] / base:7.2f}")
    print(f"export of one step's trace: {export * 1e3:.1f} ms, {size:.0f} KiB (gzip'd Chrome trace)")


if __name__ == "__main__":
    main()
