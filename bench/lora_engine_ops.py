"""What an adapter adds to one decoding step of the local engine: the number of top-level torch ops (each a kernel
launch on a GPU, where a small model's decoding step is launch-bound) for the base model, peft's mixed-adapter
forward (`adapter_names`: what the engine ran for every batch before) and the plain forward with the batch's one
adapter active (what it runs now when every request names the same adapter). Counts, not times: they are the same
on any machine.

    .venv/bin/python bench/lora_engine_ops.py [--model smollm2|tiny] [--rank 16] [--batch 64]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM


def model_dir(name: str, where: Path) -> Path:
    if name == "smollm2":
        from slime_actors.models.smollm2 import smollm2_checkpoint
        return smollm2_checkpoint(where / "smollm2")
    if name == "tiny":
        from slime_actors.models.tiny import make_tiny_model
        return make_tiny_model(where / "tiny")
    raise SystemExit(f"--model must be smollm2 or tiny, got {name!r}")


def top_level_ops(fn) -> int:
    with torch.no_grad():
        fn()   # warm: lazy initialisations are not the step's
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    if args.rank < 1 or args.batch < 1:
        raise SystemExit("--rank and --batch must be at least 1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        base = AutoModelForCausalLM.from_pretrained(model_dir(args.model, where), torch_dtype=torch.float32).eval()
        trained = get_peft_model(copy.deepcopy(base), LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                                   target_modules="all-linear"))
        trained.save_pretrained(where / "adapter")
        engine = PeftModel.from_pretrained(base, str(where / "adapter"), adapter_name="v1").eval()
        ids = torch.randint(0, min(100, base.config.vocab_size), (args.batch, 1))
        with engine.disable_adapter():
            plain = top_level_ops(lambda: engine(input_ids=ids))
        mixed = top_level_ops(lambda: engine(input_ids=ids, adapter_names=["v1"] * args.batch))
        active = top_level_ops(lambda: engine(input_ids=ids))
    print(f"one decoding step of {args.model} (batch {args.batch}), LoRA rank {args.rank} on every linear layer:\n")
    print("| forward | top-level torch ops | vs base |\n|---|---:|---:|")
    for name, n in (("base model", plain), ("mixed-adapter (adapter_names)", mixed), ("one adapter active", active)):
        print(f"| {name} | {n} | {n / plain:.2f}x |")


if __name__ == "__main__":
    main()
