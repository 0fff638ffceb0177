"""Colocated weight sync to the local engine (/update_weights_from_ipc): a flattened bucket named by a handle -- a
CUDA IPC handle on GPU (scripts/gpu_check.sh), a shared-memory file on CPU (here) -- opened by the engine, copied into
its model; and the RL loop with --update-weight-transport colocated on CPU (torch backend; megatron too where
megatron-core is installed)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slime_actors.backends.engine_client import EngineClient, EngineError
from slime_actors.backends.engine_process import LOCAL_ENGINE_MODULE, launch_engine
from slime_actors.backends.weight_sync import (bucket_metadata, load_weights_from_disk, open_shared_bucket,
                                               share_bucket, unflatten_bucket)
from slime_actors.models.tiny import make_tiny_model

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[1]


def test_share_and_open_a_cpu_bucket():
    bucket = [("a", torch.randn(3, 4)), ("b", torch.arange(5, dtype=torch.int64)),
              ("c", torch.randn(7).to(torch.bfloat16))]
    shared = share_bucket(bucket)
    h = shared.handle
    assert h["kind"] == "shm" and h["numel"] == 3 * 4 * 4 + 5 * 8 + 7 * 2 and os.path.exists(h["path"])
    json.dumps(h)  # JSON-able: it travels in an HTTP body
    meta = bucket_metadata(bucket)
    flat = open_shared_bucket(h, torch.device("cpu"))
    got = unflatten_bucket(flat, meta["names"], meta["dtypes"], meta["shapes"])
    for (n, t), (m, u) in zip(bucket, got):
        assert n == m and u.dtype == t.dtype and torch.equal(u, t)
    shared.release()
    assert not os.path.exists(h["path"])
    with pytest.raises(ValueError, match="does not exist"):
        open_shared_bucket(h, torch.device("cpu"))
    with pytest.raises(ValueError, match="needs an engine on a GPU"):
        open_shared_bucket({"kind": "cuda_ipc", "numel": 4, "device_uuid": "x"}, torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown shared bucket kind"):
        open_shared_bucket({"kind": "carrier-pigeon", "numel": 4}, torch.device("cpu"))


def hf_logprobs(model_dir, prompt, output_ids):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        lp = torch.log_softmax(m(torch.tensor([prompt + output_ids])).logits[0].float(), -1)
    return [lp[len(prompt) - 1 + j, t].item() for j, t in enumerate(output_ids)]


def test_local_engine_takes_a_colocated_bucket(tmp_path):
    base, alt = make_tiny_model(tmp_path / "base", seed=0), make_tiny_model(tmp_path / "alt", seed=1)
    proc = launch_engine(LOCAL_ENGINE_MODULE, {"model-path": str(base), "random-seed": 0},
                         log_path=tmp_path / "engine.log", startup_timeout=120)
    new = list(load_weights_from_disk(alt))
    prompt = [1, 5, 13, 6, 16]

    async def go():
        async with EngineClient(proc.base_url, timeout=60) as c:
            half = len(new) // 2
            for i, part in enumerate((new[:half], new[half:])):  # two buckets
                shared = share_bucket(part)
                try:
                    await c.update_weights_from_ipc(**bucket_metadata(part), handle=shared.handle,
                                                    weight_version=f"v{i + 1}")
                finally:
                    shared.release()
            out = await c.generate(prompt, {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
                                   return_logprob=True)
            shared = share_bucket(new[:2])
            try:
                meta = bucket_metadata(new[:3])  # describes more bytes than the bucket holds
                with pytest.raises(EngineError, match="bytes"):
                    await c.update_weights_from_ipc(**meta, handle=shared.handle)
                with pytest.raises(EngineError, match="needs an engine on a GPU"):
                    await c.update_weights_from_ipc(**bucket_metadata(new[:2]),
                                                    handle={**shared.handle, "kind": "cuda_ipc", "device_uuid": "x"})
            finally:
                shared.release()
            return out, await c.get_weight_version()
    try:
        out, version = asyncio.run(asyncio.wait_for(go(), 120))
    finally:
        assert proc.stop() == 0
    assert version == "v2"
    got = [t[0] for t in out["meta_info"]["output_token_logprobs"]]
    want = hf_logprobs(alt, prompt, out["output_ids"])
    assert max(abs(a - b) for a, b in zip(got, want)) <= 1e-5


def _train(run_dir, *flags, timeout=500, topology=None):
    """`slime-actors train` with the digits config, or `slime-actors launch TOPOLOGY` with it."""
    how = ["launch", str(topology)] if topology else ["train"]
    cmd = [sys.executable, "-m", "slime_actors.cli", *how, "--config", str(ROOT / "examples/digits/config.toml"),
           "--run-dir", str(run_dir), "--progress", "false", "--eval-interval", "0", *flags]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    assert p.returncode == 0, f"train failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]


def _check_colocated_run(steps, n):
    assert [s["weight_version_after"] for s in steps] == list(range(1, n + 1))
    # the engine generated with the weights the trainer pushed: its log-probs equal the trainer's (fp32, CPU)
    assert max(s["train/train_rollout_logprob_abs_diff_max"] for s in steps) <= 1e-5
    assert all(s["weight_sync/bytes"] > 0 for s in steps)


@pytest.mark.slow
def test_rl_loop_colocated_cpu_torch_backend(tmp_path):
    steps = _train(tmp_path / "run", "--num-rollout", "3", "--update-weight-transport", "colocated")
    _check_colocated_run(steps, 3)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None or importlib.util.find_spec("triton") is None,
                    reason="megatron-core (with triton) is not installed: it has no CPU path of its own (run here "
                           "through tests/megatron_cpu_shim.py where installed; scripts/gpu_check.sh runs it on GPU)")
def test_rl_loop_megatron_backend_cpu_colocated_and_distributed(tmp_path):
    """The whole job with --train-backend megatron (its trainer ranks with the CPU test shim, through a topology):
    trainer log-probs equal the engine's, versions advance, with colocated and with bucketed-broadcast weight sync;
    a resumed run repeats the next step exactly; the first step's loss equals the torch backend's on the same
    rollout."""
    from megatron_cpu_shim import topology
    topo = topology(tmp_path / "megatron-cpu.toml")
    m = _train(tmp_path / "m", "--num-rollout", "3", "--train-backend", "megatron", "--update-weight-transport",
               "colocated", "--save-debug-rollout-data", str(tmp_path / "rollouts"), topology=topo)
    _check_colocated_run(m, 3)
    d = _train(tmp_path / "d", "--num-rollout", "2", "--train-backend", "megatron", "--save",
               str(tmp_path / "d" / "ckpt"), "--save-interval", "1", "--save-hf",
               str(tmp_path / "d" / "hf" / "{rollout_id}"), topology=topo)
    _check_colocated_run(d, 2)
    # --save-hf from the megatron backend: after each rollout, the weights of the checkpoint of that rollout
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from slime_actors.convert import main as convert
    for k in (0, 1):
        hf = tmp_path / "d" / "hf" / str(k)
        assert json.loads((hf / ".slime-actors-export").read_text())["rollout_id"] == k
        AutoModelForCausalLM.from_pretrained(hf)
        assert convert([str(tmp_path / "d" / "ckpt" / f"iter_{k + 1:07d}"), str(tmp_path / f"conv{k}")]) == 0
        a, b = load_file(hf / "model.safetensors"), load_file(tmp_path / f"conv{k}" / "model.safetensors")
        assert sorted(a) == sorted(b) and all(torch.equal(a[n], b[n]) for n in a), k
    # resume from the step-1 checkpoint (megatron dist_checkpointing): step 2 again, exactly
    e = _train(tmp_path / "e", "--num-rollout", "2", "--train-backend", "megatron", "--load",
               str(tmp_path / "d" / "ckpt" / "iter_0000001"), topology=topo)
    assert [s["rollout_id"] for s in e] == [1]
    for key in ("rollout/reward_mean", "train/loss", "train/grad_norm", "train/entropy"):
        assert e[0][key] == d[1][key], key
    t = _train(tmp_path / "t", "--num-rollout", "1", "--debug-train-only", "--load-debug-rollout-data",
               str(tmp_path / "rollouts"))
    assert abs(t[0]["train/loss"] - m[0]["train/loss"]) <= 1e-6
    assert t[0]["train/grad_norm"] == pytest.approx(m[0]["train/grad_norm"], rel=1e-4)
