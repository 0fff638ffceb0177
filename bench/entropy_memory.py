"""What the training forward's entropy metric adds to the trainer's peak memory: the entropy of every response row
computed at once (before 2026-12-06) against a chunk of rows at a time (`entropy_without_grad`,
slime_actors/algo/logprobs.py), side by side in one run, on CPU.

    .venv/bin/python bench/entropy_memory.py [--rows 4096] [--vocab 49152] [--rounds 2]

The training forward keeps the response rows' log-softmax for the backward (the rows of a micro-batch: `--rows`
response tokens over a `--vocab` vocabulary, fp32 -- SmolLM2-135M's 49,152 by default) and computes the entropy of
each row as a metric. Per way and round, in this process: the resident high-water mark (VmHWM, reset through
/proc/self/clear_refs) over the log-probs and the entropy, less what was resident before. The entropies must be the
same both ways, and are checked. Linux only (it reads /proc).

    python3 bench/entropy_memory.py --update MODEL_DIR --device cuda [--samples 128]      # one GPU

runs instead one GRPO update (rl_update, the torch backend, fp32, a KL loss, the whole batch in one micro-batch) of
the model in MODEL_DIR on `--samples` samples (groups of 8, 60-token prompts, responses of 40-128 random tokens),
each way in a fresh process (two rounds), and prints torch's peak allocated and reserved GPU memory, the update's
seconds and the entropy metric (the same both ways).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

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


def update(way: str, model_dir: str, samples: int, device: str) -> dict:
    """One rl_update in this process with the entropy metric computed `way`; torch's peak memory."""
    import random
    import tempfile
    import types

    import slime_actors.backends.torch_backend as tb
    from bench.train_step import config
    from slime_actors.backends.rl_update import rl_update
    import json
    vocab = int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])
    rng = random.Random(0)
    tokens, plen, rlen, groups = [], [], [], []
    for g in range(max(1, samples // 8)):
        p = [rng.randrange(3, vocab) for _ in range(60)]
        for _ in range(8):
            r = [rng.randrange(3, vocab) for _ in range(rng.randint(40, 128))]
            tokens.append(p + r)
            plen.append(60)
            rlen.append(len(r))
            groups.append(g)
    n = len(tokens)
    batch = {"sample_index": list(range(n)), "group_index": groups, "tokens": tokens, "prompt_lengths": plen,
             "response_lengths": rlen, "loss_masks": [[1] * r for r in rlen], "rollout_log_probs": [[] for _ in rlen],
             "rewards": [float(rng.random() < 0.5) for _ in rlen], "weight_versions": [0] * n}
    a = types.SimpleNamespace(work=tempfile.mkdtemp(prefix="bench-entropy-"), micro_batch=n, device=device)
    cfg = config(model_dir, a, batch, "+ response logits")
    if way.startswith("all rows"):
        tb.entropy_without_grad = lambda x, t: entropy_from_logits(x.detach(), t).detach()
    torch.manual_seed(0)
    b = tb.TorchBackend(cfg, 0, 1)
    b.init()
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.monotonic()
    m = rl_update(b, cfg, dict(batch), 0)
    if cuda:
        torch.cuda.synchronize()
    gib = 1 << 30
    return {"way": way, "response_tokens": sum(rlen), "seconds": time.monotonic() - t,
            "allocated": torch.cuda.max_memory_allocated() / gib if cuda else None,
            "reserved": torch.cuda.max_memory_reserved() / gib if cuda else None,
            "entropy": float(m.get("train/entropy", m.get("entropy", float("nan"))))}


def main_update(a, ways: tuple[str, ...]) -> None:
    import json
    import subprocess
    got: dict[str, list[dict]] = {w: [] for w in ways}
    for r in range(a.rounds):
        for w in (ways if r % 2 == 0 else ways[::-1]):
            p = subprocess.run([sys.executable, __file__, "--one", w, "--update", a.update, "--device", a.device,
                                "--samples", str(a.samples)], capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                raise SystemExit(f"{w}: exit {p.returncode}\n{p.stderr[-3000:]}")
            got[w].append(json.loads(p.stdout.strip().splitlines()[-1]))
    ent = {round(x["entropy"], 4) for rows in got.values() for x in rows}
    assert len(ent) == 1, f"the entropy differs between the ways: {ent}"
    print(f"# one GRPO update, {a.samples} samples in one micro-batch, fp32, {got[ways[0]][0]['response_tokens']} "
          f"response tokens, the model in {a.update} on {a.device} ({time.strftime('%Y-%m-%d %H:%M %Z')}, torch "
          f"{torch.__version__}); the largest of {a.rounds} rounds")
    print("| entropy computed | peak allocated GiB | peak reserved GiB | update s (median) |")
    print("|---|---:|---:|---:|")
    for w, rows in got.items():
        secs = sorted(x["seconds"] for x in rows)[len(rows) // 2]
        if a.device == "cuda":
            alloc = f"{max(x['allocated'] for x in rows):.2f}"
            res = f"{max(x['reserved'] for x in rows):.2f}"
        else:
            alloc = res = "n/a (CPU)"
        print(f"| {w} | {alloc} | {res} | {secs:.2f} |")
    print(f"(the entropy metric the same both ways: {ent.pop()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--update", default=None, help="a model directory: measure one GRPO update instead")
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)   # (a subprocess of --update: one way)
    a = ap.parse_args()
    ways = ("all rows at once (before)", "a chunk of rows at a time (now)")
    if a.update and a.one:
        import json
        print(json.dumps(update(a.one, a.update, a.samples, a.device)))
        return
    if a.update:
        main_update(a, ways)
        return
    torch.manual_seed(0)
    flat = torch.randn(a.rows, a.vocab, requires_grad=True)
    targets = torch.randint(0, a.vocab, (a.rows,))
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
