"""Where the trainer's host memory goes on CPU: one process per setting, RSS / PSS / malloc after each phase.

    .venv/bin/python bench/train_memory.py [--model smollm2:135m] [--samples 64] [--micro-batch 16] [--updates 3]

The trainer's work as the GRPO job does it, in a fresh process per setting (settings alternating, `--repeats`
rounds): the torch backend built (actor, reference: --use-kl-loss 0.01), then `--updates` RL updates on a batch like
bench/train_step.py's (its batch builder and flags; `--samples` samples of a ~40-token prompt and 4-64 response
tokens, micro-batches of `--micro-batch`), each followed by a weight sync's trainer side (the bucketed flat copy
`DistributedWeightSender` broadcasts, without a receiver). As in the job, the work runs on an asyncio loop's thread
pool (`run_in_executor`, the actors' `run_blocking`), with the mailbox's malloc settings
(`allocator.keep_freed(256)`).

After each phase the process's RSS and PSS (/proc), the peak RSS within the phase (VmHWM, reset by clear_refs),
and glibc's view (mallinfo2: bytes in use; bytes free but kept in its heaps) are read; torch's own view is counted
exactly: parameters, gradients, AdamW state and the reference model's tensors, and per micro-batch the tensors
autograd saves for the backward (a saved_tensors_hooks pack hook, distinct storages, weights excluded) and the
logits. Settings:

    before        what the trainer did before memory was looked at: --trainer-release-memory false (no trim after
                  the update or a sync; the sync's flat buffer kept between syncs), and each training micro-batch's
                  logits kept until the next one's forward has returned (the bench holds them as the training
                  loop's local variable did), the log-probs from a slice of the logits per sample (the old loop's)
    after-slices  after, but the log-probs from a slice of the logits per sample (the gather's share)
    before-glibc  the same without the mailbox's malloc settings (glibc's defaults: how much is theirs)
    after         this tree's default (--trainer-release-memory true)
    after-arena1  and one malloc arena (MALLOC_ARENA_MAX=1): an allocator knob, measured, not a default

`--log-prob-part` times only the training loop's log-prob part (forward and backward from random logits of a
micro-batch's shape), a slice per sample against one gather, alternating.

Linux with glibc only (it reads /proc and calls mallinfo2 / malloc_trim).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench.cmdline import command_line  # noqa: E402

MIB = 1 << 20
SETTINGS = {
    "before": {"release": False, "keep": True, "env": {}},
    "before-glibc": {"release": False, "keep": False, "env": {}},
    "after-slices": {"release": True, "keep": True, "env": {}, "slices": True},
    "after": {"release": True, "keep": True, "env": {}},
    "after-arena1": {"release": True, "keep": True, "env": {"MALLOC_ARENA_MAX": "1"}},
    "after-mmap1m": {"release": True, "keep": True, "env": {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}},
    "after-ckpt": {"release": True, "keep": True, "env": {}, "ckpt": True},
}


# -- readings ------------------------------------------------------------------------------------------------------

class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


_libc = ctypes.CDLL(None)
_libc.mallinfo2.restype = _Mallinfo2


def _status() -> dict[str, int]:
    with open("/proc/self/status") as f:
        d = dict(line.split(":", 1) for line in f)
    return {k: int(d[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}


def _pss() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def reading(phase: str, **extra) -> dict:
    """RSS, PSS, peak RSS since the last reset, and malloc's in-use / free-but-kept bytes (all MiB)."""
    st = _status()
    mi = _libc.mallinfo2()
    out = {"phase": phase, "rss": st["VmRSS"] / MIB, "pss": _pss() / MIB, "peak_rss": st["VmHWM"] / MIB,
           "malloc_in_use": (mi.uordblks + mi.hblkhd) / MIB, "malloc_free_kept": mi.fordblks / MIB}
    out.update(extra)
    return out


# -- the child: one setting in a fresh process ---------------------------------------------------------------------

def child(a) -> None:
    rows: list[dict] = []

    def mark(phase: str, reset: bool = True, **extra) -> None:
        rows.append(reading(phase, **extra))
        print(f"  {phase}: rss {rows[-1]['rss']:.0f} MiB, peak {rows[-1]['peak_rss']:.0f}", file=sys.stderr,
              flush=True)
        if reset:
            _reset_peak()

    _reset_peak()
    mark("python started")
    import torch
    import transformers  # noqa: F401  (the imports' share)

    from slime_actors.backends import rl_update as rl_update_mod
    from slime_actors.backends.torch_backend import TorchBackend
    from slime_actors.backends.weight_sync import DistributedWeightSender, WeightPusher
    from slime_actors.mailbox import allocator
    from slime_actors.models.resolve import model_cache, resolve_checkpoint
    from train_step import config, make_batch    # bench/train_step.py: the same batch and flags
    from transformers import AutoConfig
    if a.keep:
        allocator.keep_freed(256)                # the mailbox's default in every actor process
    mark("imports (torch, transformers, slime_actors)")

    model_dir = resolve_checkpoint(a.model, model_cache(None))
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    batch = make_batch(a.samples, vocab, seed=7)
    a.work = tempfile.mkdtemp(prefix="train_memory_")
    a.device = "cpu"
    cfg = config(model_dir, a, batch, "+ response logits")
    cfg.train.trainer_release_memory = a.release
    cfg.train.gradient_checkpointing = a.ckpt
    torch.manual_seed(0)
    b = TorchBackend(cfg, 0, 1)
    loads = iter(["actor loaded", "reference loaded"])
    load = b._load_causal_lm

    def counted_load(path):
        m = load(path)
        mark(next(loads))
        return m
    b._load_causal_lm = counted_load

    loop = asyncio.new_event_loop()

    def in_thread(fn, *args):        # as Actor.run_blocking: the loop's default thread pool
        return loop.run_until_complete(loop.run_in_executor(None, lambda: fn(*args)))

    in_thread(b.init)
    mark("backend built (optimizer made, no state yet)")

    def nbytes(ts) -> float:
        return sum(t.numel() * t.element_size() for t in ts) / MIB

    params = [p for p in b._raw_model.parameters()]
    weights_mib = nbytes(params)
    ref_mib = nbytes(b.ref_model.parameters()) if b.ref_model is not None else 0.0
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    if b.ref_model is not None:
        param_ptrs |= {p.untyped_storage().data_ptr() for p in b.ref_model.parameters()}

    # per micro-batch: after its forward (logits and what autograd saved) and after its backward
    state = {"update": 0, "mb": 0, "saved": {}, "logits": 0.0}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in param_ptrs:
            state["saved"][s.data_ptr()] = s.nbytes()
        return t

    if a.slices:   # the training loop's log-probs as before: a slice of the logits per sample
        from slime_actors.algo.logprobs import entropy_from_logits, log_probs_and_entropy

        def per_slice(mb, width, logits, temp, entropy_grad):
            off = width - logits.shape[1]
            lps, ents = [], []
            for j, (s, e) in enumerate(b._response_slices(mb)):
                lg = logits[j, s - off:e - off]
                lp, ent = log_probs_and_entropy(lg, b._targets(mb, j), temp, with_entropy=entropy_grad)
                if not entropy_grad:
                    with torch.no_grad():
                        ent = entropy_from_logits(lg.detach(), temp)
                lps.append(lp)
                ents.append(ent)
            return lps, ents
        b._response_log_probs = per_slice
    logits_fn = b._logits
    held: list = [None]

    def logits_hook(*x, **k):
        out = logits_fn(*x, **k)
        if torch.is_grad_enabled():
            if a.hold_logits:    # the training loop's old `logits` local: alive until the next forward returned
                held[0] = out
            state["logits"] = out.numel() * out.element_size() / MIB
            mark(f"update {state['update']}: micro-batch {state['mb']} forward", reset=False,
                 saved_for_backward=sum(state["saved"].values()) / MIB, logits=state["logits"])
        return out
    b._logits = logits_hook
    train_mbs = b.train_micro_batches

    def per_micro_batch(micro, loss_fn, train_critic=False):
        totals: dict[str, float] = {}
        for mb in micro:
            state["saved"] = {}
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = train_mbs([mb], loss_fn, train_critic)
            for k, v in out.items():
                totals[k] = totals.get(k, 0.0) + v
            mark(f"update {state['update']}: micro-batch {state['mb']} backward", reset=False)
            state["mb"] += 1
        return totals
    b.train_micro_batches = per_micro_batch
    step = b.optimizer_step

    def opt_step(critic=False):
        out = step(critic)
        opt_mib = nbytes([v for s in b.optimizer.state.values() for v in s.values() if torch.is_tensor(v)])
        mark(f"update {state['update']}: optimizer step", reset=False, optimizer_state=opt_mib)
        return out
    b.optimizer_step = opt_step
    log_probs = b.compute_log_probs

    def lp(batch_, model="actor", with_entropy=False):
        out = log_probs(batch_, model, with_entropy)
        mark(f"update {state['update']}: {model} log-probs", reset=False)
        return out
    b.compute_log_probs = lp

    pusher = WeightPusher(cfg, b, actor=None, run_blocking=None, address=lambda: "127.0.0.1", run_dir=a.work)
    pusher.sender = DistributedWeightSender("127.0.0.1", 1, world_size=2)   # never connected: its flat copies only

    def sync():
        for bucket in b.weight_buckets(cfg.weights.update_weight_buffer_size):
            pusher.sender._flatten([t for _, t in bucket])
        pusher.release()                         # what WeightPusher.push does at its end

    def update(u):
        t0, c0 = time.monotonic(), time.process_time()
        rl_update_mod.rl_update(b, cfg, dict(batch), u)
        t1 = time.monotonic()
        b.release_host_memory()                  # what TrainerRank._update does after rl_update
        return t1 - t0, time.monotonic() - t1, time.process_time() - c0

    for u in range(a.updates):
        state["update"], state["mb"] = u, 0
        wall, trim_s, cpu = in_thread(update, u)
        mark(f"update {u}: done (peak within the update)", wall=wall, trim=trim_s, cpu=cpu)
        in_thread(sync)
        mark(f"update {u}: weight sync done")
    print(json.dumps({"rows": rows, "weights": weights_mib, "ref": ref_mib,
                      "threads": torch.get_num_threads()}), flush=True)


# -- the log-prob part alone: a slice of the logits per sample against one gather ----------------------------------

def log_prob_part(rounds: int = 6, batch: int = 16, positions: int = 67, vocab: int = 49152) -> None:
    """Forward and backward of the response log-probs (and the no-grad entropy) from random logits of a training
    micro-batch's shape, as the training loop did them before (a slice per sample) and does now (the response rows
    gathered at once), alternating; CPU and wall seconds, medians."""
    import random

    import torch

    from slime_actors.algo.logprobs import entropy_from_logits, log_probs_and_entropy
    torch.manual_seed(0)
    rng = random.Random(0)
    base = torch.randn(batch, positions, vocab)
    lens = [rng.randint(4, 64) for _ in range(batch)]
    slices = [(positions - n, positions) for n in lens]
    targets = [torch.randint(0, vocab, (n,)) for n in lens]

    def per_slice(logits):
        lps = []
        for j, (s, e) in enumerate(slices):
            lg = logits[j, s:e]
            lps.append(log_probs_and_entropy(lg, targets[j], 1.0)[0])
            with torch.no_grad():
                entropy_from_logits(lg.detach(), 1.0)
        return torch.cat(lps)

    def gathered(logits):
        rows = torch.cat([torch.full((e - s,), j) for j, (s, e) in enumerate(slices)])
        cols = torch.cat([torch.arange(s, e) for s, e in slices])
        flat = logits[rows, cols]
        with torch.no_grad():
            entropy_from_logits(flat.detach(), 1.0)
        return log_probs_and_entropy(flat, torch.cat(targets), 1.0)[0]

    runs: dict[str, list[tuple[float, float]]] = {"a slice per sample (before)": [], "one gather (after)": []}
    fns = dict(zip(runs, (per_slice, gathered)))
    for r in range(rounds):
        for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
            x = base.clone().requires_grad_(True)
            c0, t0 = time.process_time(), time.monotonic()
            fns[name](x).sum().backward()
            runs[name].append((time.process_time() - c0, time.monotonic() - t0))
    print(f"# the training loop's log-prob part alone ({time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.node()}, "
          f"load average {os.getloadavg()[0]:.1f}); logits {batch} x {positions} x {vocab} fp32, "
          f"{sum(lens)} response tokens, {rounds} rounds alternating")
    print(f"command: {command_line()}")
    print()
    print("| log-probs from | CPU s (median) | wall s (median) |")
    print("|---|---:|---:|")
    for name, v in runs.items():
        print(f"| {name} | {statistics.median(c for c, _ in v):.3f} | {statistics.median(w for _, w in v):.3f} |")


# -- the parent's side, shared with bench/engine_memory.py ---------------------------------------------------------

def run_settings(names: list[str], repeats: int, command: Callable[[str], list[str]],
                 env: Callable[[str], dict] = lambda s: {}) -> dict[str, list[dict]]:
    """Each setting's child (`command(setting)`, its environment plus `env(setting)`) `repeats` times, settings
    alternating; the JSON each printed last, by setting."""
    runs: dict[str, list[dict]] = {s: [] for s in names}
    for r in range(repeats):
        for s in names[r % len(names):] + names[:r % len(names)]:
            print(f"round {r}: {s}", file=sys.stderr, flush=True)
            p = subprocess.run(command(s), stdout=subprocess.PIPE, text=True, env={**os.environ, **env(s)}, cwd=ROOT)
            if p.returncode != 0:
                sys.exit(f"{s}: the child failed (exit {p.returncode})")
            runs[s].append(json.loads(p.stdout.strip().splitlines()[-1]))
    return runs


def print_header(what: str, load0: float, where: str = "CPU") -> None:
    """The report's first two lines: what, on which device, when, where, the load average at the start and now; the
    command."""
    print(f"# {what} on {where} ({time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)")
    print(f"command: {command_line()}")


def median_of(runs: dict[str, list[dict]], s: str, i: int, key: str) -> float:
    """The median over a setting's runs of row i's `key` (nan if no run has it)."""
    vals = [run["rows"][i].get(key) for run in runs[s]]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else float("nan")


def print_phases(runs: dict[str, list[dict]], names: list[str],
                 notes: Callable[[dict, Callable[[str], float]], list[str]]) -> None:
    """Per setting, a table of its phases: RSS, PSS, peak RSS, malloc's view, and `notes(row, med)`."""
    for s in names:
        print()
        print(f"## {s}")
        print()
        print("| phase | RSS | PSS | peak RSS in the phase | malloc in use | malloc free, kept | torch: counted |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for i, row in enumerate(runs[s][0]["rows"]):
            def med(key: str, i: int = i, s: str = s) -> float:
                return median_of(runs, s, i, key)
            print(f"| {row['phase']} | {med('rss'):.0f} | {med('pss'):.0f} | {med('peak_rss'):.0f} | "
                  f"{med('malloc_in_use'):.0f} | {med('malloc_free_kept'):.0f} | {', '.join(notes(row, med))} |")


# -- the parent: settings side by side ----------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1, help="rounds of every setting (alternating)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated, of: " + ", ".join(SETTINGS))
    ap.add_argument("--log-prob-part", action="store_true",
                    help="only time the training loop's log-prob part, before (a slice per sample) and after")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.log_prob_part:
        log_prob_part()
        return
    if a.child is not None:
        a.release, a.keep = SETTINGS[a.child]["release"], SETTINGS[a.child]["keep"]
        a.ckpt = SETTINGS[a.child].get("ckpt", False)
        a.hold_logits = not a.release
        a.slices = SETTINGS[a.child].get("slices", not a.release)
        child(a)
        return
    names = [s.strip() for s in a.settings.split(",") if s.strip()]
    bad = [s for s in names if s not in SETTINGS]
    if bad:
        ap.error(f"--settings: unknown {bad}; known: {list(SETTINGS)}")
    load0 = os.getloadavg()[0]
    runs = run_settings(names, a.repeats,
                        lambda s: [sys.executable, __file__, "--child", s, "--model", a.model, "--samples",
                                   str(a.samples), "--micro-batch", str(a.micro_batch), "--updates", str(a.updates)],
                        lambda s: SETTINGS[s]["env"])
    print_header("the trainer's memory", load0)
    first = runs[names[0]][0]
    print(f"model {a.model}: weights {first['weights']:.0f} MiB fp32, reference {first['ref']:.0f} MiB; "
          f"{a.samples} samples, micro-batches of {a.micro_batch}, {a.updates} updates, each followed by a weight "
          f"sync's flat copy; torch threads {first['threads']}; MiB, median over {a.repeats} run(s)")

    def med(s: str, i: int, key: str) -> float:
        return median_of(runs, s, i, key)

    def notes(row: dict, med: Callable[[str], float]) -> list[str]:
        out = [f"{label} {med(key):.0f}" for key, label in (("saved_for_backward", "saved for backward"),
                                                             ("logits", "logits"), ("optimizer_state", "AdamW state"))
               if key in row]
        if "wall" in row:
            out.append(f"update {med('wall'):.1f} s wall ({med('cpu'):.1f} s CPU), trim {med('trim') * 1000:.0f} ms")
        return out

    print_phases(runs, names, notes)
    print()
    print("## side by side")
    print()
    print("| setting | peak RSS over the run | peak RSS in the last update | RSS after the last sync | "
          "PSS after the last sync | malloc free, kept, after it | update wall s (median) | update CPU s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in names:
        rows = runs[s][0]["rows"]
        peaks = [max(r["peak_rss"] for r in run["rows"]) for run in runs[s]]
        last = len(rows) - 1
        done = [i for i, r in enumerate(rows) if "wall" in r]
        timed = done[1:] or done   # the first update is warm-up: left out unless it is the only one (--updates 1)
        walls = [run["rows"][i]["wall"] for run in runs[s] for i in timed]
        cpus = [run["rows"][i]["cpu"] for run in runs[s] for i in timed]
        print(f"| {s} | {statistics.median(peaks):.0f} | {med(s, done[-1], 'peak_rss'):.0f} | "
              f"{med(s, last, 'rss'):.0f} | {med(s, last, 'pss'):.0f} | {med(s, last, 'malloc_free_kept'):.0f} | "
              f"{statistics.median(walls):.1f} | {statistics.median(cpus):.1f} |")


if __name__ == "__main__":
    main()
