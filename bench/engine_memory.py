"""Where the local engine's host memory goes on CPU: one process per setting, RSS / PSS / malloc after each phase.

    .venv/bin/python bench/engine_memory.py [--model smollm2:135m] [--prompts 8] [--group 8] [--max-new 64] \\
        [--syncs 2] [--settings before,after] [--repeats 1]

The engine's work as the GRPO job on CPU does it (scripts/compare_trl.sh --device cpu ... --prompts 8 --group 8
--max-len 64), in a fresh process per setting (settings alternating, `--repeats` rounds): the scheduler
(local_engine.scheduler.Engine, built from the launch flags the job gives it: --device cpu --max-running-requests 64
--random-seed) on its own thread, driven in-process without the HTTP side; a rollout of `--prompts` x `--group`
requests (the job's chat-formatted "What is a + b?" prompts, temperature 1, `--max-new` tokens, log-probs, a
sampling seed per request), then a weight sync -- a sender process broadcasts the model's weights (fp32, scaled by
1 + 0.001 x the sync's number, so each sync changes them) in the trainer's 512 MiB buckets over gloo, the engine
receives them on its scheduler thread as /update_weights_from_distributed does (flattened buckets) -- then the next
rollout, `--syncs` times.

After each phase the process's RSS and PSS (/proc), the peak RSS within the phase (VmHWM, reset by clear_refs), and
glibc's view (mallinfo2: bytes in use; bytes free but kept in its heaps) are read; torch's view is counted: the model's
weights (distinct storages), the receive buffers the engine keeps beyond them, and the key/value cache at its largest
(after each scheduler step). Each rollout's tokens and log-probs are hashed: settings must give the same ones.

    before   the engine before its memory was looked at: --keep-host-memory (a sync received into a buffer kept
             between syncs and copied into the model; no malloc_trim after a batch or a sync)
    after    this tree's default: a sync received in place (the buffer becomes the parameters' storage), malloc
             trimmed when a batch empties and after a sync

Linux with glibc only (it reads /proc and calls mallinfo2 / malloc_trim).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_memory import (MIB, _reset_peak, median_of, print_header, print_phases,  # noqa: E402
                          reading, run_settings)

GROUP = "bench-weights"
SETTINGS = {"before": ["--keep-host-memory"], "after": []}


# -- the sender: the trainer's side of a sync, in its own process -------------------------------------------------

def sender(a) -> None:
    """Rank 0 of the weight-update group: per line on stdin, one sync -- per bucket, its metadata as a JSON line on
    stdout, then the broadcast."""
    from types import SimpleNamespace

    from slime_actors.backends.training import TrainingBackend
    from slime_actors.backends.weight_sync import DistributedWeightSender, bucket_metadata, load_weights_from_disk
    base = [(n, t.float()) for n, t in load_weights_from_disk(a.model_dir)]
    s = DistributedWeightSender("127.0.0.1", a.sender, world_size=2, backend="gloo", group_name=GROUP)
    s.connect()
    for i, _ in enumerate(sys.stdin):
        named = [(n, t * (1 + 0.001 * (i + 1))) for n, t in base]
        fake = SimpleNamespace(named_weights=lambda: iter(named))   # the trainer's bucketing, on these weights
        for bucket in TrainingBackend.weight_buckets(fake, 512 << 20):
            meta = bucket_metadata(bucket)
            meta["dtypes"] = [str(d) for d in meta["dtypes"]]
            print(json.dumps(meta), flush=True)
            s.broadcast_bucket(bucket, True)
        print(json.dumps({"done": True}), flush=True)
        s.release_buffer()
        del named
    s.close()


# -- the child: the engine, one setting in a fresh process --------------------------------------------------------

def child(a) -> None:
    rows: list[dict] = []

    def mark(phase: str, **extra) -> None:
        rows.append(reading(phase, **extra))
        print(f"  {phase}: rss {rows[-1]['rss']:.0f} MiB, peak {rows[-1]['peak_rss']:.0f}", file=sys.stderr,
              flush=True)
        _reset_peak()

    _reset_peak()
    mark("python started")
    import torch
    import transformers  # noqa: F401  (the imports' share)

    from slime_actors.backends.local_engine.cli import parse_args
    from slime_actors.backends.local_engine.params import SamplingParams
    from slime_actors.backends.local_engine.scheduler import Engine, Req
    from slime_actors.backends.weight_sync import dtype_from_name, find_free_port, init_weights_update_group
    mark("imports (torch, transformers, the engine)")

    args = parse_args(["--model-path", a.model_dir, "--random-seed", "1", "--weight-version", "0", "--device", "cpu",
                       "--max-running-requests", str(a.prompts * a.group), *SETTINGS[a.child]])
    eng = Engine(args)

    def weights_mib() -> float:
        seen: dict[int, int] = {}
        for t in [*eng.model.parameters(), *eng.model.buffers()]:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(seen.values()) / MIB

    def buffers_mib() -> float:   # receive buffers kept beyond the weights
        return sum(rx._buffer.numel() for rx in eng.receivers.values() if rx._buffer is not None) / MIB

    mark("model and tokenizer loaded", weights=weights_mib())
    kv = {"peak": 0}

    def count_kv(fn):
        def step(*x, **k):
            out = fn(*x, **k)
            if eng.cache is not None:
                kv["peak"] = max(kv["peak"], sum(k_.nbytes + v_.nbytes for k_, v_ in eng._kv(eng.cache)))
            return out
        return step
    eng._prefill, eng._decode = count_kv(eng._prefill), count_kv(eng._decode)
    eng.start()

    def on_scheduler(fn, needs_idle=False):
        done = threading.Event()
        box: list = []
        eng.command(fn, lambda res, err: (box.append((res, err)), done.set()), needs_idle=needs_idle)
        done.wait()
        if box[0][1] is not None:
            raise box[0][1]
        return box[0][0]

    port = find_free_port("127.0.0.1")
    snd = subprocess.Popen([sys.executable, __file__, "--sender", str(port), "--model-dir", a.model_dir],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    eng.groups[GROUP] = (init_weights_update_group("127.0.0.1", port, 1, 2, GROUP, "gloo"), "gloo")
    mark("scheduler started, weight-update group joined")

    tok = eng.tokenizer
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": f"What is {10 + 7 * i} + {31 + 11 * i}? Put "
                                             "your final answer in \\boxed{}."}], add_generation_prompt=True,
                                           tokenize=False), add_special_tokens=False)["input_ids"]
               for i in range(a.prompts)]
    digests = []

    def rollout(r: int) -> None:
        kv["peak"] = 0
        outs: list = []
        left = threading.Semaphore(0)
        reqs = []
        for i in range(a.prompts * a.group):
            q = Req(rid=f"r{r}-{i}", prompt_ids=list(prompts[i // a.group]), return_logprob=True,
                    params=SamplingParams(max_new_tokens=a.max_new, temperature=1.0, sampling_seed=1000 * r + i))
            q.on_done = lambda out: (outs.append(out), left.release())
            reqs.append(q)
        t0 = time.monotonic()
        eng.submit(reqs)
        for _ in reqs:
            left.acquire()
        wall = time.monotonic() - t0
        on_scheduler(lambda: None)        # the step that finished the batch is over (and what follows it)
        h = hashlib.sha256()
        for out in sorted(outs, key=lambda o: o["meta_info"]["id"]):
            h.update(json.dumps(out["output_ids"]).encode())
            for lp, _, _ in out["meta_info"]["output_token_logprobs"]:
                h.update(struct.pack("<d", lp))
        digests.append(h.hexdigest()[:16])
        tokens = sum(len(o["output_ids"]) for o in outs)
        mark(f"rollout {r}: {len(outs)} requests, {tokens} tokens", kv_cache=kv["peak"] / MIB, wall=wall,
             weights=weights_mib(), buffers=buffers_mib())

    def sync(s: int) -> None:
        snd.stdin.write("go\n")
        snd.stdin.flush()
        t0, n = time.monotonic(), 0
        while True:
            meta = json.loads(snd.stdout.readline())
            if meta.get("done"):
                break
            dts = [dtype_from_name(d.removeprefix("torch.")) for d in meta["dtypes"]]
            n += on_scheduler(lambda: eng.receive_weights(GROUP, meta["names"], dts, meta["shapes"], True),
                              needs_idle=True)
        mark(f"weight sync {s + 1}: {n} tensors", wall=time.monotonic() - t0, weights=weights_mib(),
             buffers=buffers_mib())

    for s in range(a.syncs):
        rollout(s)
        sync(s)
    rollout(a.syncs)
    snd.stdin.close()
    snd.wait(60)
    eng.stop()
    print(json.dumps({"rows": rows, "digests": digests, "threads": torch.get_num_threads(), "trims": eng.trims}),
          flush=True)


# -- the parent: settings side by side ----------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--syncs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1, help="rounds of every setting (alternating)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated, of: " + ", ".join(SETTINGS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sender", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.sender is not None:
        sender(a)
        return
    if a.child is not None:
        child(a)
        return
    for k in ("prompts", "group", "max_new", "syncs", "repeats"):
        if getattr(a, k) < (0 if k == "syncs" else 1):
            ap.error(f"--{k.replace('_', '-')} {getattr(a, k)}: too small")
    names = [s.strip() for s in a.settings.split(",") if s.strip()]
    bad = [s for s in names if s not in SETTINGS]
    if bad:
        ap.error(f"--settings: unknown {bad}; known: {list(SETTINGS)}")
    from slime_actors.models.resolve import model_cache, resolve_checkpoint
    model_dir = str(resolve_checkpoint(a.model, model_cache(None)))
    load0 = os.getloadavg()[0]
    runs = run_settings(names, a.repeats,
                        lambda s: [sys.executable, __file__, "--child", s, "--model-dir", model_dir, "--prompts",
                                   str(a.prompts), "--group", str(a.group), "--max-new", str(a.max_new), "--syncs",
                                   str(a.syncs)])
    print_header("the local engine's memory", load0)
    first = runs[names[0]][0]
    print(f"model {a.model} (fp32); rollouts of {a.prompts} x {a.group} requests, up to {a.max_new} new tokens, "
          f"{a.syncs} weight sync(s) between them (512 MiB buckets, gloo); torch threads {first['threads']}; MiB, "
          f"median over {a.repeats} run(s)")

    def med(s: str, i: int, key: str) -> float:
        return median_of(runs, s, i, key)

    def notes(row: dict, med) -> list[str]:
        out = [f"{label} {med(key):.0f}" for key, label in (("weights", "weights"), ("buffers", "receive buffers kept"),
                                                             ("kv_cache", "KV cache at its largest")) if key in row]
        return out + ([f"{med('wall'):.1f} s"] if "wall" in row else [])

    print_phases(runs, names, notes)
    print()
    print("## side by side")
    print()
    print("| setting | peak RSS over the run | peak RSS in a sync | PSS after the last sync | PSS after the last "
          "rollout | malloc free, kept, after it | sync s (median) | rollout s (median) | same tokens and "
          "log-probs as the first |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for s in names:
        rows = runs[s][0]["rows"]
        syncs = [i for i, r in enumerate(rows) if r["phase"].startswith("weight sync")]
        rolls = [i for i, r in enumerate(rows) if r["phase"].startswith("rollout")]
        peaks = [max(r["peak_rss"] for r in run["rows"]) for run in runs[s]]
        sync_peak = max((med(s, i, "peak_rss") for i in syncs), default=float("nan"))
        same = all(run["digests"] == runs[names[0]][0]["digests"] for run in runs[s])
        print(f"| {s} | {statistics.median(peaks):.0f} | {sync_peak:.0f} | "
              f"{med(s, syncs[-1], 'pss') if syncs else float('nan'):.0f} | {med(s, rolls[-1], 'pss'):.0f} | "
              f"{med(s, rolls[-1], 'malloc_free_kept'):.0f} | "
              f"{statistics.median([run['rows'][i]['wall'] for run in runs[s] for i in syncs] or [float('nan')]):.2f}"
              f" | {statistics.median(run['rows'][i]['wall'] for run in runs[s] for i in rolls):.1f} | "
              f"{'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
