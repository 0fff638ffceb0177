"""The training forward's head: the micro-batch's whole logits against a chunk of rows at a time, side by side.

    .venv/bin/python bench/head_memory.py [--model smollm2:135m] [--samples 32] [--micro-batch 16] [--updates 3]
                                          [--repeats 2] [--device cpu|cuda]

Each setting in a fresh process, settings alternating (`--repeats` rounds); in each, the torch backend built with
bench/train_step.py's flags and batch (a ~40-token prompt, 4-64 response tokens, --use-kl-loss 0.01), one RL update
to warm up, then `--updates` updates, each timed and its peak memory read: on CPU the process's peak RSS within the
update (VmHWM, reset before it), on a GPU the allocator's peak (torch.cuda.max_memory_allocated, reset before it).
The bytes autograd saves for the backward in the training micro-batches (a saved_tensors_hooks pack hook, distinct
storages, weights excluded) are counted too. Settings:

    logits    the model's logits for the micro-batch's response positions, their log-softmax and gradients (what
              the training forward did before 2026-12-07, and still does under DDP / FSDP2 or for a model outside
              TorchBackend.CHUNKED_HEAD_MODELS)
    chunked   the body's hidden states and the head a chunk of rows at a time (algo.logprobs.head_log_probs)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_memory import _reset_peak, _status, print_header, run_settings  # noqa: E402

MIB = 1 << 20
SETTINGS = ("logits", "chunked")


def child(a) -> None:
    import torch

    from slime_actors.backends.rl_update import rl_update
    from slime_actors.backends.torch_backend import TorchBackend
    from slime_actors.models.resolve import model_cache, resolve_checkpoint
    from train_step import config, make_batch
    from transformers import AutoConfig

    model_dir = resolve_checkpoint(a.model, model_cache(None))
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    batch = make_batch(a.samples, vocab, seed=7)
    a.work = tempfile.mkdtemp(prefix="head_memory_")
    cfg = config(model_dir, a, batch, "+ response logits")
    torch.manual_seed(0)
    b = TorchBackend(cfg, 0, 1)
    b.init()
    if a.child == "logits":
        b._chunked_head = lambda module: None
    cuda = b.device.type == "cuda"
    params = {p.untyped_storage().data_ptr() for p in b._raw_model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            saved[s.data_ptr()] = s.nbytes()
        return t
    train = b.train_micro_batches
    per_mb: list[int] = []

    def counted(micro, loss_fn, train_critic=False):
        totals: dict[str, float] = {}
        for mb in micro:
            saved.clear()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = train([mb], loss_fn, train_critic)
            per_mb.append(sum(saved.values()))
            for k, v in out.items():
                totals[k] = totals.get(k, 0.0) + v
        return totals
    b.train_micro_batches = counted

    rows = []
    for u in range(a.updates + 1):       # update 0 warms up
        per_mb.clear()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if cuda else _status()["VmRSS"]
        _reset_peak()
        t0 = time.perf_counter()
        m = rl_update(b, cfg, dict(batch), u)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() if cuda else _status()["VmHWM"]
        if u:
            rows.append({"wall": wall, "peak_over_start": (peak - base) / MIB, "peak": peak / MIB,
                         "saved_per_mb": max(per_mb) / MIB, "loss": float(m.get("loss", 0.0))})
        print(f"  {a.child} update {u}: {wall:.2f} s, peak {peak / MIB:.0f} MiB", file=sys.stderr, flush=True)
    print(json.dumps({"rows": rows, "device": str(b.device), "vocab": vocab,
                      "threads": torch.get_num_threads()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="rounds of both settings (alternating)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--child", default=None, choices=SETTINGS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        child(a)
        return
    load0 = os.getloadavg()[0]
    runs = run_settings(list(SETTINGS), a.repeats,
                        lambda s: [sys.executable, __file__, "--child", s, "--model", a.model, "--samples",
                                   str(a.samples), "--micro-batch", str(a.micro_batch), "--updates", str(a.updates),
                                   "--device", a.device])
    first = runs[SETTINGS[0]][0]
    print_header("the training forward's head: whole logits against chunks", load0,
                 "CPU" if first["device"] == "cpu" else f"the GPU ({first['device']})")
    where = "peak RSS of the process" if first["device"] == "cpu" else "torch.cuda.max_memory_allocated"
    print(f"model {a.model} (vocabulary {first['vocab']}), {a.samples} samples, micro-batches of {a.micro_batch}, "
          f"device {first['device']}, torch threads {first['threads']}; {a.updates} updates per run after one to "
          f"warm up, {a.repeats} run(s) per setting; medians; peak memory: {where} within the update (MiB)")
    print()
    print("| setting | update wall s | peak within the update | peak above the update's start | "
          "saved for the backward, largest micro-batch | loss (first update) |")
    print("|---|---:|---:|---:|---:|---:|")
    for s in SETTINGS:
        rows = [r for run in runs[s] for r in run["rows"]]

        def med(key: str) -> float:
            return statistics.median(r[key] for r in rows)
        print(f"| {s} | {med('wall'):.2f} | {med('peak'):.0f} | {med('peak_over_start'):.0f} | "
              f"{med('saved_per_mb'):.0f} | {runs[s][0]['rows'][0]['loss']:.6f} |")


if __name__ == "__main__":
    main()
