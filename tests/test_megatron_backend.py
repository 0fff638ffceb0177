"""The megatron backend against the torch backend and plain HF forwards, on CPU (megatron-core through the CPU test
shim, tests/megatron_cpu_shim.py, gloo between spawned ranks): log-probs, one rl_update step (metrics, updated
weights), named_weights in HF layout, dist_checkpointing save/load with exact resume, save_hf -- at world size 1 and
with tensor, pipeline and data parallelism (distributed optimizer) on 2 ranks.

Needs megatron-core (and triton, which it imports); CI has neither and skips. To run here:
    python -m venv /tmp/mcore-venv && /tmp/mcore-venv/bin/pip install torch megatron-core triton transformers \
        safetensors pyzmq msgpack uvloop structlog aiohttp pytest pytest-timeout pyarrow tqdm
    /tmp/mcore-venv/bin/python -m pytest tests/test_megatron_backend.py
(docs/megatron.md). The shim patches torch process-wide, so megatron runs only in the spawned workers and every
HF / torch-backend reference is computed in the test process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("triton") is None,
    reason="megatron-core (with triton) is not installed: it has no CPU path of its own; these tests run it on CPU "
           "through a shim where it is installed, and scripts/gpu_check.sh runs it on GPU")

from test_torch_backend import hf_reference_log_probs, make_args, toy_batch  # noqa: E402

from slime_actors.backends.batching import select  # noqa: E402


# -- spawned ranks -------------------------------------------------------------------------------------------------

def _rank_main(rank: int, world: int, port: int, scenario: str, kw: dict, out: str) -> None:
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.dirname(__file__))
    from megatron_cpu_shim import install
    install()  # megatron-core on CPU: only in these spawned ranks (it patches torch process-wide)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    res = SCENARIOS[scenario](rank, world, **kw)
    if rank == 0:
        torch.save(res, out)


def spawn(scenario: str, world: int, tmp_path, timeout: float = 500, **kw):
    import torch.multiprocessing as mp

    from slime_actors.backends.weight_sync import find_free_port
    out = str(tmp_path / f"{scenario}-{world}.pt")
    ctx = mp.start_processes(_rank_main, args=(world, find_free_port(), scenario, kw, out), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"{scenario} on {world} ranks did not finish in {timeout}s")
    return torch.load(out, weights_only=True)  # (a result of our own ranks: tensors, numbers, strings)


def _backend(model_dir, tmp, rank, world, **flags):
    from slime_actors.backends.megatron_backend import MegatronBackend
    args = make_args(tmp, model_dir, train_backend="megatron", micro_batch_size=3, lr=1e-2,
                     actor_num_gpus_per_node=world, **flags)
    b = MegatronBackend(args, rank, world)
    b.init()
    return args, b


def _shard(batch: dict, b) -> dict:
    """What the trainer gets from the buffer: whole prompt groups, by data-parallel rank."""
    idx = [i for i, g in enumerate(batch["group_index"]) if g % b.data_parallel_size == b.data_parallel_rank]
    return select(batch, idx)


def _weights(b) -> dict:
    return {k: v.detach().clone().cpu() for k, v in b.named_weights()}


def policy_grads(b, args, batch: dict, shard) -> dict:
    """Gradients of the policy loss (fixed advantages, global denominator) over this rank's shard, in HF names."""
    from slime_actors.backends.batching import micro_batches_from_config
    from slime_actors.backends.rl_update import _prepare, make_policy_loss_fn
    work = _prepare(batch)
    work["old_log_probs"], _ = b.compute_log_probs(work)
    work["advantages"] = [torch.full_like(o, float(i % 3) - 1.0) for i, o in enumerate(work["old_log_probs"])]
    part = shard(work)
    mbs = [select(part, idx) for idx in micro_batches_from_config(args.train, [len(t) for t in part["tokens"]])]
    world = getattr(b, "data_parallel_size", 1)
    b.train_micro_batches(mbs, make_policy_loss_fn(args.algorithm, float(len(batch["tokens"])), world))
    if hasattr(b, "_export"):
        return {k: v.detach().clone().cpu() for k, v in b._export(lambda p: p.main_grad)}
    return {n: p.grad.detach().clone() for n, p in b._raw_model.named_parameters() if p.grad is not None}


def scenario_full(rank, world, model_dir, tmp, ckpt=False, grads=True, **flags):
    """log-probs, named_weights, gradients, one rl_update, (save, another update, load, the same update again)."""
    from slime_actors.backends.rl_update import rl_update
    args, b = _backend(model_dir, tmp, rank, world, **flags)
    batch = toy_batch()
    res = {"w0": _weights(b)}
    lp, ent = b.compute_log_probs(batch, with_entropy=True)
    res.update(lp=lp, ent=ent, dp=b.data_parallel_size)
    if grads:  # (the distributed optimizer reduce-scatters: no rank holds the full gradient)
        res["grads"] = policy_grads(b, args, batch, lambda work: _shard(work, b))
    res["metrics"] = rl_update(b, args, _shard(batch, b), 0)
    res["w1"] = _weights(b)
    # the same tensors converted afresh from the parameters (named_weights may reuse views made before the step)
    res["w1_fresh"] = {k: v.detach().clone().cpu() for k, v in b._export(lambda p: p.detach().clone())}
    res["lp1"], _ = b.compute_log_probs(batch)
    if ckpt:
        b.save(os.path.join(tmp, "ckpt"))
        rl_update(b, args, _shard(batch, b), 1)
        res["w2"] = _weights(b)
        b.load(os.path.join(tmp, "ckpt"))
        res["w1_loaded"] = _weights(b)
        rl_update(b, args, _shard(batch, b), 1)
        res["w2_again"] = _weights(b)
        b.save_hf(os.path.join(tmp, "hf_out"))
    return res


def scenario_convert(rank, world, model_dir, tmp, dist_in, **flags):
    """A trained model's save (dist_checkpointing), then a torch_dist that `slime-actors convert` wrote from the HF
    model loaded back through megatron-core's dist_checkpointing into this parallel layout."""
    from megatron.core import dist_checkpointing

    from slime_actors.backends.rl_update import rl_update
    args, b = _backend(model_dir, tmp, rank, world, **flags)
    rl_update(b, args, _shard(toy_batch(), b), 0)
    res = {"trained": _weights(b)}
    b.save(os.path.join(tmp, "ckpt", "trainer"))
    b.save_hf(os.path.join(tmp, "hf_out"), {"rollout_id": 0})
    state = dist_checkpointing.load(b._sharded_state(False, is_loading=True), dist_in)
    missing, unexpected = b.gpt.load_state_dict(state["model"], strict=False)
    res["missing"] = [k for k in missing if not k.endswith("_extra_state")] + list(unexpected)
    b.optimizer.reload_model_params()
    res["loaded"] = _weights(b)
    return res


SCENARIOS = {"full": scenario_full, "convert": scenario_convert}


# -- references (this process: no shim here) ----------------------------------------------------------------------

def hf_weights(model_dir) -> dict:
    from slime_actors.backends.weight_sync import load_weights_from_disk
    return dict(load_weights_from_disk(model_dir))


def torch_reference(model_dir, tmp):
    from slime_actors.backends.rl_update import rl_update
    from slime_actors.backends.torch_backend import TorchBackend
    args = make_args(tmp, model_dir, micro_batch_size=3, lr=1e-2)
    b = TorchBackend(args, 0, 1)
    b.init()
    batch = toy_batch()
    grads = policy_grads(b, args, batch, lambda work: work)
    b.optimizer.zero_grad(set_to_none=True)
    metrics = rl_update(b, args, batch, 0)
    w1 = {k: v.detach().clone() for k, v in b.named_weights()}
    lp1, _ = b.compute_log_probs(batch)
    return metrics, w1, lp1, grads


def hf_entropies(model_dir, batch):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for toks, p, r in zip(batch["tokens"], batch["prompt_lengths"], batch["response_lengths"]):
            logp = torch.log_softmax(m(torch.tensor([toks])).logits[0].float(), -1)[p - 1:p + r - 1]
            out.append(-(logp.exp() * logp).sum(-1))
    return out


def random_hf_model(path, arch, tie, vocab):
    """A random HF model with the tiny tokenizer's ids (vocab >= 36), saved to path."""
    from transformers import AutoConfig, AutoModelForCausalLM
    kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=tie, pad_token_id=0)
    if arch == "qwen3":
        kw["head_dim"] = 24
    torch.manual_seed(3)
    m = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **kw))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.normal_(1.0, 0.2)
    m.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from slime_actors.models.tiny import make_tiny_model
    base = tmp_path_factory.mktemp("models")
    return {"llama": str(make_tiny_model(base / "llama")),
            "qwen2": random_hf_model(base / "qwen2", "qwen2", tie=False, vocab=37),  # odd: tp=2 pads the vocab
            "qwen3": random_hf_model(base / "qwen3", "qwen3", tie=True, vocab=40)}


def close(a: dict, b: dict, atol: float) -> float:
    assert sorted(a) == sorted(b)
    diffs = {k: float((a[k].float() - b[k].float()).abs().max()) for k in a}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= atol, (worst, diffs[worst])
    return diffs[worst]


def check_against_references(res, model_dir, tmp):
    batch = toy_batch()
    close(res["w1"], res["w1_fresh"], 0.0)  # what engines get after a step is the trained model, exactly
    w0 = hf_weights(model_dir)
    assert sorted(res["w0"]) == sorted(w0)
    for k in w0:  # named_weights before training: the HF checkpoint, bit for bit
        assert torch.equal(res["w0"][k], w0[k]), k
    ref = hf_reference_log_probs(model_dir, batch)
    assert max(float((a - r).abs().max()) for a, r in zip(res["lp"], ref)) <= 1e-5
    ents = hf_entropies(model_dir, batch)
    assert max(float((a - r).abs().max()) for a, r in zip(res["ent"], ents)) <= 1e-5
    metrics, w1, lp1, grads = torch_reference(model_dir, tmp / "torch")
    if "grads" in res:  # the same gradients, whatever the parallel layout
        close(res["grads"], grads, 1e-6)
        assert max(float(g.abs().max()) for g in grads.values()) > 1e-2
    for key in ("loss", "pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "grad_norm", "adv_mean", "reward_mean",
                "num_samples", "num_tokens"):
        assert res["metrics"][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key
    assert metrics["grad_norm"] > 0
    # Adam's first step is ~lr * sign(g): elements whose gradient is ~eps (1e-8) -- a key bias, whose gradient is
    # zero up to rounding -- turn fp32 noise into steps of up to ~lr. The loss is (nearly) flat along exactly those
    # elements, so the updated model's log-probs agree tightly; elementwise the weights agree to ~2 lr.
    moved = max(float((res["w1"][k] - w0[k]).abs().max()) for k in w0)
    assert moved > 1e-3  # the step did something (lr 1e-2)
    close(res["w1"], w1, 2.5e-2)
    assert max(float((a - r).abs().max()) for a, r in zip(res["lp1"], lp1)) <= 1e-4


# -- tests ---------------------------------------------------------------------------------------------------------

def test_single_rank_matches_torch_backend_and_resumes_exactly(models, tmp_path):
    res = spawn("full", 1, tmp_path, model_dir=models["llama"], tmp=str(tmp_path / "w"), ckpt=True)
    check_against_references(res, models["llama"], tmp_path)
    # resume: load restores model and optimizer; the next update is bit-identical
    close(res["w1_loaded"], res["w1"], 0.0)
    close(res["w2_again"], res["w2"], 0.0)
    # save_hf: an HF directory that transformers loads, with the trained weights
    from transformers import AutoModelForCausalLM
    out = tmp_path / "w" / "hf_out"
    m = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    sd = {k: v for k, v in m.state_dict().items() if k in res["w2_again"]}
    close(sd, res["w2_again"], 0.0)
    assert (out / "tokenizer.json").exists() or (out / "tokenizer_config.json").exists()


def test_tensor_parallel_2(models, tmp_path):
    res = spawn("full", 2, tmp_path, model_dir=models["qwen2"], tmp=str(tmp_path / "w"),
                tensor_model_parallel_size=2)
    assert res["dp"] == 1
    check_against_references(res, models["qwen2"], tmp_path)


def test_pipeline_parallel_2(models, tmp_path):
    res = spawn("full", 2, tmp_path, model_dir=models["qwen3"], tmp=str(tmp_path / "w"),
                pipeline_model_parallel_size=2)
    check_against_references(res, models["qwen3"], tmp_path)


def test_data_parallel_2_distributed_optimizer_resumes(models, tmp_path):
    res = spawn("full", 2, tmp_path, model_dir=models["llama"], tmp=str(tmp_path / "w"), ckpt=True,
                use_distributed_optimizer=True, grads=False)
    assert res["dp"] == 2
    check_against_references(res, models["llama"], tmp_path)
    close(res["w1_loaded"], res["w1"], 0.0)
    close(res["w2_again"], res["w2"], 0.0)


@pytest.mark.parametrize("arch,flags,pad", [
    ("llama", {}, None),
    ("qwen2", {"tensor_model_parallel_size": 2}, 38),   # odd vocabulary: tp=2 saves 38 rows
    ("qwen3", {"pipeline_model_parallel_size": 2}, None),
])
def test_convert_to_and_from_megatron_dist_checkpoints(models, tmp_path, arch, flags, pad):
    """`slime-actors convert` against megatron-core itself: a dist_checkpointing save of a trained model (TP, PP)
    becomes the HF directory of exactly its weights (and equals save_hf's), and the torch_dist it writes from an
    HF model loads through dist_checkpointing into the model, bit for bit."""
    from slime_actors.convert import main as convert
    dist_in = tmp_path / "from_hf"
    assert convert([models[arch], str(dist_in)] + (["--padded-vocab-size", str(pad)] if pad else [])) == 0
    w = tmp_path / "w"
    res = spawn("convert", 2 if flags else 1, tmp_path, model_dir=models[arch], tmp=str(w),
                dist_in=str(dist_in / "release"), **flags)
    assert res["missing"] == []
    close(res["loaded"], hf_weights(models[arch]), 0.0)
    assert convert([str(w / "ckpt" / "trainer"), str(tmp_path / "hf"), "--hf-checkpoint", models[arch]]) == 0
    close(hf_weights(tmp_path / "hf"), res["trained"], 0.0)
    close(hf_weights(w / "hf_out"), res["trained"], 0.0)
    assert json.loads((w / "hf_out" / ".slime-actors-export").read_text())["backend"] == "megatron"
