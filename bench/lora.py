"""LoRA against full fine-tuning, side by side in one run: the torch backend's RL step on a model, each mode in a
fresh process (so its peak memory is its own).

    .venv/bin/python bench/lora.py                                   # CPU: the tiny model and SmolLM2-135M
    .venv/bin/python bench/lora.py --models smollm2 --device cuda    # one GPU (peak = torch's max allocated)
    .venv/bin/python bench/lora.py --models /path/to/hf_model --device cuda --batch 32 --length 512

Per model and mode (full fine-tuning; LoRA of --rank on every linear layer):

    trainable       parameters the optimizer updates
    optimizer MiB   AdamW's state (exp_avg, exp_avg_sq, step) after the steps
    peak MiB        the process's peak resident memory on CPU (ru_maxrss: model, reference model, optimizer,
                    activations), or torch's peak allocated GPU memory with --device cuda -- measured before the sync
    step s          one rl_update (reference + old log-probs, one optimizer step over the batch), median of --steps
    sync MiB / s    what the engines get after a step and how long it takes end to end on one host: the trainer
                    gathers it, writes it (full: an HF directory of safetensors; LoRA: a PEFT adapter directory) and
                    an engine-side model loads it (full: every tensor copied in; LoRA: peft's load_adapter)

The RL step has --use-kl-loss on: full fine-tuning keeps a second copy of the model for the reference, LoRA switches
its adapters off instead. Batches are synthetic (random tokens: --batch samples of --length tokens, half prompt);
the model's answer does not matter to what is measured. The table and the command go in docs/lora.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = {"tiny": "tiny:digits", "smollm2": "smollm2:135m"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny", "smollm2"],
                   help="tiny, smollm2, or Hugging Face model directories")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    p.add_argument("--steps", type=int, default=3, help="timed RL steps per mode (after one warm-up step)")
    p.add_argument("--batch", type=int, default=8, help="samples per step")
    p.add_argument("--length", type=int, default=64, help="tokens per sample (half prompt, half response)")
    p.add_argument("--bf16", action="store_true", help="train in bfloat16 (as on a GPU)")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)   # internal: measure one (model, mode)
    a = p.parse_args(argv)
    for name, val in (("--rank", a.rank), ("--steps", a.steps), ("--batch", a.batch), ("--length", a.length)):
        if val < 1:
            p.error(f"{name} must be >= 1, got {val}")
    if a.length < 4:
        p.error(f"--length must be >= 4 (a prompt and a response), got {a.length}")
    for m in a.models:
        if m not in MODELS and not (Path(m) / "config.json").is_file():
            p.error(f"--models {m}: neither one of {', '.join(MODELS)} nor a Hugging Face model directory")
    return a


def _config(a, model: str, mode: str, tmp: Path):
    from slime_actors.config import parse_config
    prompts = tmp / "prompts.jsonl"
    prompts.write_text(json.dumps({"input": "1 + 1 =", "label": "2"}) + "\n")
    argv = ["--prompt-data", str(prompts), "--hf-checkpoint", MODELS.get(model, model), "--rm-type", "exact_match",
            "--run-dir", str(tmp / "run"), "--device", a.device, "--rollout-batch-size", "1",
            "--n-samples-per-prompt", str(a.batch), "--micro-batch-size", str(min(a.batch, 8)), "--lr", "1e-5",
            "--use-kl-loss", "--kl-loss-coef", "0.01"]
    if a.bf16:
        argv.append("--bf16")
    if mode == "lora":
        argv += ["--lora-rank", str(a.rank)]
    return parse_config(argv)


def _batch(a, vocab: int, seed: int = 0) -> dict:
    import torch
    g = torch.Generator().manual_seed(seed)
    p, r = a.length // 2, a.length - a.length // 2
    toks = torch.randint(3, vocab, (a.batch, a.length), generator=g).tolist()
    return {"sample_index": list(range(a.batch)), "group_index": [0] * a.batch, "tokens": toks,
            "prompt_lengths": [p] * a.batch, "response_lengths": [r] * a.batch, "loss_masks": [[1] * r] * a.batch,
            "rollout_log_probs": [[] for _ in range(a.batch)],
            "rewards": [float(i % 2) for i in range(a.batch)], "weight_versions": [0] * a.batch}


def _peak_mib(device: str) -> float:
    if device == "cuda":
        import torch
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def measure_one(a, model: str, mode: str) -> dict:
    """One (model, mode) in this process: build, step, sync; the row of the table."""
    import torch
    from slime_actors.backends.rl_update import rl_update
    from slime_actors.backends.torch_backend import TorchBackend
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    os.environ.setdefault("SLIME_ACTORS_MODEL_CACHE", str(ROOT / "runs" / ".models"))
    cfg = _config(a, model, mode, tmp)
    b = TorchBackend(cfg, 0, 1)
    b.init()
    vocab = int(b._raw_model.get_output_embeddings().weight.shape[0])
    times = []
    for k in range(a.steps + 1):
        batch = _batch(a, vocab, seed=k)
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        rl_update(b, cfg, batch, k)
        if a.device == "cuda":
            torch.cuda.synchronize()
        if k:   # the first step warms up (allocator, kernels) and creates the optimizer state
            times.append(time.perf_counter() - t0)
    peak = _peak_mib(a.device)
    trainable = sum(p.numel() for p in b._raw_model.parameters() if p.requires_grad)
    opt_bytes = sum(t.numel() * t.element_size() for st in b.optimizer.state.values() for t in st.values()
                    if torch.is_tensor(t))
    sync_bytes, sync_s = _sync(b, mode, tmp / "sync")
    return {"model": model, "mode": "full" if mode == "full" else f"LoRA r{a.rank}", "trainable": trainable,
            "total": sum(p.numel() for p in b._raw_model.parameters()) - (trainable if mode == "lora" else 0),
            "optimizer_mib": opt_bytes / 2**20, "peak_mib": peak, "step_s": statistics.median(times),
            "sync_mib": sync_bytes / 2**20, "sync_s": sync_s}


def _sync(b, mode: str, out: Path) -> tuple[int, float]:
    """What the engines get, end to end on one host: gather, write, load into an engine-side model."""
    import torch
    from transformers import AutoModelForCausalLM
    engine = AutoModelForCausalLM.from_pretrained(b.hf_path, dtype=b.dtype).to(b.device).eval()
    if b.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    if mode == "lora":
        from peft import PeftModel

        from slime_actors.backends.lora import ADAPTER_FILE, write_adapter_dir
        write_adapter_dir(out, b.adapter_weights(), b.adapter_config())
        nbytes = (out / ADAPTER_FILE).stat().st_size
        PeftModel.from_pretrained(engine, str(out), adapter_name="v1")
    else:
        from slime_actors.backends.weight_sync import load_weights_from_disk, save_weights_to_disk
        save_weights_to_disk(b.named_weights(), out, b.hf_path)
        nbytes = sum(f.stat().st_size for f in out.glob("*.safetensors"))
        params = dict(engine.named_parameters())
        with torch.no_grad():
            for name, t in load_weights_from_disk(out):
                params[name].copy_(t.to(params[name].device))
    if b.device.type == "cuda":
        torch.cuda.synchronize()
    return nbytes, time.perf_counter() - t0


def main(argv=None) -> None:
    a = parse_args(argv)
    if a.one:
        model, mode = a.one.split("@")
        print(json.dumps(measure_one(a, model, mode)))
        return
    rows = []
    for model in a.models:
        for mode in ("full", "lora"):
            args = [sys.executable, __file__, "--one", f"{model}@{mode}", "--device", a.device, "--rank", str(a.rank),
                    "--steps", str(a.steps), "--batch", str(a.batch), "--length", str(a.length)] + \
                (["--bf16"] if a.bf16 else [])
            print(f"measuring {model} ({mode}) ...", file=sys.stderr, flush=True)
            p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
            if p.returncode != 0:
                raise SystemExit(f"{model} ({mode}) failed:\n{p.stderr[-4000:]}")
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
    print(table(rows, a))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


def table(rows: list[dict], a) -> str:
    import torch
    where = (torch.cuda.get_device_name(0) if a.device == "cuda" else
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch threads "
             f"{torch.get_num_threads()}")
    lines = [f"LoRA vs full fine-tuning: one rl_update of {a.batch} samples x {a.length} tokens "
             f"({'bf16' if a.bf16 else 'fp32'}, --use-kl-loss), {where}", "",
             "| model | mode | trainable params | optimizer state MiB | peak MiB | step s | sync MiB | sync s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = 100 * r["trainable"] / max(r["total"], 1)
        lines.append(f"| {r['model']} | {r['mode']} | {r['trainable']:,} ({share:.2f}%) | {r['optimizer_mib']:.2f} | "
                     f"{r['peak_mib']:.0f} | {r['step_s']:.3f} | {r['sync_mib']:.3f} | {r['sync_s']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
