"""What the training forward's entropy metric adds to the trainer's peak memory: the entropy of every response row
computed at once (before 2026-12-06) against a chunk of rows at a time (`entropy_without_grad`,
slime_actors/algo/logprobs.py), side by side in one run, on CPU.

    .venv/bin/python bench/entropy_memory.py [--rows 4096] [--vocab 49152] [--rounds 2]

The training forward keeps the response rows' log-softmax for the backward (the rows of a micro-batch: `--rows`
response tokens over a `--vocab` vocabulary, fp32 -- SmolLM2-135M's 49,152 by default) and computes the entropy of
each row as a metric. Per way and round, in this process: the resident high-water mark (VmHWM, reset through
/proc/self/clear_refs) over the log-probs and the entropy, less what was resident before. The entropies must be the
same both ways, and are checked. Linux only (it reads /proc).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from slime_actors.algo.logprobs import entropy_from_logits, entropy_without_grad, log_probs_and_entropy  # noqa: E402


def _hwm_mib() -> int:
    with open("/proc/self/status") as f:
        return int(f.read().split("VmHWM:")[1].split()[0]) // 1024


def _rss_mib() -> int:
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) // 1024


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def one(flat: torch.Tensor, targets: torch.Tensor, way: str) -> tuple[int, torch.Tensor]:
    _reset_hwm()
    base = _rss_mib()
    lp, _ = log_probs_and_entropy(flat, targets, 1.0, with_entropy=False)   # kept for the backward
    if way == "all rows at once (before)":
        with torch.no_grad():
            ent = entropy_from_logits(flat.detach(), 1.0)
    else:
        ent = entropy_without_grad(flat, 1.0)
    peak = _hwm_mib() - base
    del lp
    return peak, ent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(0)
    flat = torch.randn(a.rows, a.vocab, requires_grad=True)
    targets = torch.randint(0, a.vocab, (a.rows,))
    ways = ("all rows at once (before)", "a chunk of rows at a time (now)")
    peaks: dict[str, list[int]] = {w: [] for w in ways}
    ents: dict[str, torch.Tensor] = {}
    for r in range(a.rounds):
        for w in (ways if r % 2 == 0 else ways[::-1]):
            peak, ents[w] = one(flat, targets, w)
            peaks[w].append(peak)
    torch.testing.assert_close(ents[ways[0]], ents[ways[1]], rtol=1e-6, atol=1e-6)
    size = a.rows * a.vocab * 4 >> 20
    print(f"# the entropy metric of {a.rows} response rows over a {a.vocab}-token vocabulary (fp32 rows: {size} MiB; "
          f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"Python {platform.python_version()})")
    print("| entropy computed | peak over the log-probs and the entropy, MiB (largest of the rounds) |")
    print("|---|---:|")
    for w in ways:
        print(f"| {w} | {max(peaks[w])} |")
    print("(the same entropies both ways: checked)")


if __name__ == "__main__":
    main()
