"""The trainer's half of a step, before and after, side by side in one process: rl_update on one batch.

    .venv/bin/python bench/train_step.py [--model smollm2:135m] [--rounds 3] [--samples 32] [--micro-batch 16]
    python3 bench/train_step.py --device cuda --samples 128 --micro-batch 16          # one GPU

One GRPO batch like the CPU comparison's (prompts of ~40 tokens, responses of 4-64 tokens, a KL loss against the
reference model, one optimizer step per rollout) is trained on by a fresh torch backend in each mode, the modes in
a rotating order each round (the machine's load moves between rounds; the medians are compared):

    before            the old-policy log-probs from a forward of their own, logits over every position
    on-policy         the old log-probs from the training forward (rl_update's rule), logits over every position
    + response logits also the logits of the response positions only (logits_to_keep)
    + chunked head    and the response log-probs from the body's hidden states and the head a chunk of rows at a
                      time, in the training forward and the reference pass (this tree's default; the modes above
                      run --head-chunk-mib 0: the whole logits)
    + dynamic         and micro-batches packed by tokens (--use-dynamic-batch-size, --max-tokens-per-gpu = the
                      micro-batch size x the mean sample length: the same tokens per micro-batch on average)
    + one ref pass    and the reference forward in one pass (--log-probs-max-tokens-per-gpu = the batch's tokens)
    + tf32            and the fp32 matmuls in TF32 (--tf32; on a GPU only: CPUs have no TF32)
    + bf16 mixed      the "+ one ref pass" update in mixed precision instead (--bf16: bf16 autocast over fp32
                      weights and AdamW states)

Prints the forwards each mode ran and, per update (median), the process's CPU seconds (one torch thread: what the
update costs, which other work on a shared machine inflates far less than the wall time) and the wall seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.cmdline import command_line  # noqa: E402

WHOLE_LOGITS = ("before", "on-policy", "+ response logits")
MODES = ["before", "on-policy", "+ response logits", "+ chunked head", "+ dynamic", "+ one ref pass", "+ tf32",
         "+ bf16 mixed"]
PACKED = ("+ dynamic", "+ one ref pass", "+ tf32", "+ bf16 mixed")


def make_batch(n: int, vocab: int, seed: int) -> dict:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(36, 44))] for _ in range(n // 4)]
    tokens, plen, rlen, groups = [], [], [], []
    for g, p in enumerate(prompts):
        for _ in range(4):
            r = [rng.randrange(3, vocab) for _ in range(rng.randint(4, 64))]
            tokens.append(p + r)
            plen.append(len(p))
            rlen.append(len(r))
            groups.append(g)
    return {"sample_index": list(range(len(tokens))), "group_index": groups, "tokens": tokens,
            "prompt_lengths": plen, "response_lengths": rlen, "loss_masks": [[1] * r for r in rlen],
            "rollout_log_probs": [[] for _ in rlen], "rewards": [float(rng.random() < 0.5) for _ in rlen],
            "weight_versions": [0] * len(rlen)}


def config(model_dir: str, a, batch: dict, mode: str):
    from slime_actors.config import parse_config
    tmp = Path(a.work)
    prompts = tmp / "prompts.jsonl"
    prompts.write_text('{"input": "x", "label": "y"}\n')
    n = len(batch["tokens"])
    flags = ["--prompt-data", str(prompts), "--hf-checkpoint", model_dir, "--rm-type", "exact_match",
             "--run-dir", str(tmp / "run"), "--rollout-batch-size", str(n // 4), "--n-samples-per-prompt", "4",
             "--global-batch-size", str(n), "--micro-batch-size", str(a.micro_batch), "--lr", "1e-5",
             "--use-kl-loss", "--kl-loss-coef", "0.01", "--kl-loss-type", "low_var_kl", "--seed", "1", "--device", a.device]
    mean_len = sum(len(t) for t in batch["tokens"]) / n
    if mode in PACKED:
        flags += ["--use-dynamic-batch-size", "--max-tokens-per-gpu", str(int(a.micro_batch * mean_len))]
    if mode in PACKED[1:]:
        flags += ["--log-probs-max-tokens-per-gpu", str(sum(len(t) for t in batch["tokens"]))]
    if mode in WHOLE_LOGITS:
        flags += ["--head-chunk-mib", "0"]
    if mode == "+ bf16 mixed":
        flags += ["--bf16"]
    return parse_config(flags)


def run_mode(model_dir: str, a, batch: dict, mode: str) -> tuple[float, float, int]:
    import torch

    from slime_actors.backends.rl_update import rl_update
    from slime_actors.backends.torch_backend import TorchBackend
    cfg = config(model_dir, a, batch, mode)
    torch.manual_seed(0)
    b = TorchBackend(cfg, 0, 1)
    b.init()
    if mode in ("before", "on-policy"):
        b._keep = lambda mb, width: 0          # logits over every position, as before
    forwards = [0]
    logits, hidden = b._logits, b._hidden   # a forward through the head, or the body alone (the chunked head)

    def counted(fn):
        def call(*x, **k):
            forwards[0] += 1
            return fn(*x, **k)
        return call
    b._logits, b._hidden = counted(logits), counted(hidden)
    # (--tf32 as the trainer actor asks it on a GPU: torch's matmul precision, put back after the update)
    torch.set_float32_matmul_precision("high" if mode == "+ tf32" else "highest")
    try:
        t0, c0 = time.monotonic(), time.process_time()
        rl_update(b, cfg, dict(batch), 0, old_from_training=False if mode == "before" else None)
        if a.device == "cuda":
            torch.cuda.synchronize()
        return time.process_time() - c0, time.monotonic() - t0, forwards[0]
    finally:
        torch.set_float32_matmul_precision("highest")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    import tempfile

    import torch
    from transformers import AutoConfig

    from slime_actors.models.resolve import model_cache, resolve_checkpoint
    if a.threads:
        torch.set_num_threads(a.threads)
    a.work = a.work or tempfile.mkdtemp(prefix="train_step_")
    model_dir = resolve_checkpoint(a.model, model_cache(None))
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    batch = make_batch(a.samples, vocab, seed=7)
    modes = [m for m in MODES if m != "+ tf32" or a.device == "cuda"]
    res: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    fwd: dict[str, int] = {}
    load0 = os.getloadavg()[0]
    for r in range(a.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m in order:
            c, t, n = run_mode(model_dir, a, batch, m)
            res[m].append(c)
            wall[m].append(t)
            fwd[m] = n
            print(f"round {r} {m}: {c:.2f} s CPU, {t:.2f} s wall, {n} forwards", file=sys.stderr, flush=True)
    load1 = os.getloadavg()[0]
    toks = sum(len(t) for t in batch["tokens"])
    print(f"# the trainer's update ({time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load0:.1f} at the start, "
          f"{load1:.1f} at the end; {a.rounds} rounds)")
    print(f"command: {command_line()}")
    print(f"model {a.model}; {a.samples} samples, {toks} tokens ({sum(batch['response_lengths'])} response tokens); "
          f"micro-batches of {a.micro_batch}; KL loss (reference forward); one optimizer step")
    print()
    print("| mode | forwards | CPU seconds (median) | min | max | CPU vs before | wall seconds (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = statistics.median(res["before"])
    for m in modes:
        med = statistics.median(res[m])
        print(f"| {m} | {fwd[m]} | {med:.2f} | {min(res[m]):.2f} | {max(res[m]):.2f} | {med / base:.2f} | "
              f"{statistics.median(wall[m]):.2f} |")


if __name__ == "__main__":
    main()
