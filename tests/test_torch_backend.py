"""The torch training backend and rl_update on CPU with the tiny model (2 layers, hidden 64)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch

from slime_actors.backends.batching import select
from slime_actors.backends.rl_update import _prepare, make_policy_loss_fn, rl_update
from slime_actors.backends.torch_backend import TorchBackend
from slime_actors.config import JobConfig, parse_config
from slime_actors.models.tiny import make_tiny_model

try:
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
except Exception:  # pragma: no cover
    pass

torch.set_num_threads(1)

# tiny vocabulary ids: <pad>=0 <s>=1 </s>=2, digits "0".."9" = 3..12, "+"=13, "="=16
BOS, EOS, PLUS, EQ = 1, 2, 13, 16


def D(d: int) -> int:
    return 3 + d


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def make_args(tmp: str | os.PathLike, model_dir: str, **overrides):
    """A JobConfig from the real flag parser: a one-line prompt file, the tiny model, exact_match reward,
    small batches. Overrides use flag names with underscores (True = a store_true flag, False/None = left out)."""
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    prompts = tmp / "prompts.jsonl"
    if not prompts.exists():
        prompts.write_text(json.dumps({"input": "1 + 1 =", "label": "2"}) + "\n")
    flags = {"prompt_data": str(prompts), "hf_checkpoint": model_dir, "rm_type": "exact_match",
             "run_dir": str(tmp / "run"), "rollout_batch_size": 2, "n_samples_per_prompt": 2, "lr": 1e-3,
             "micro_batch_size": 4, "clip_grad": 0, "seed": 1}
    flags.update(overrides)
    argv = []
    for k, v in flags.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            argv.append(flag)
        elif v is False or v is None:
            continue
        else:
            argv += [flag, str(v)]
    return parse_config(argv)


def make_batch(responses, rewards, groups=None, prompt=(BOS, D(1), PLUS, D(1), EQ), masks=None, rollout_lp=None,
               start_index=0):
    """A batch (as batch_from_samples makes) with one prompt and the given response token lists."""
    n = len(responses)
    prompts = [list(prompt)] * n if isinstance(prompt[0], int) else [list(p) for p in prompt]
    return {
        "sample_index": list(range(start_index, start_index + n)),
        "group_index": list(groups) if groups is not None else [0] * n,
        "tokens": [p + list(r) for p, r in zip(prompts, responses)],
        "prompt_lengths": [len(p) for p in prompts],
        "response_lengths": [len(r) for r in responses],
        "loss_masks": [list(m) for m in masks] if masks is not None else [[1] * len(r) for r in responses],
        "rollout_log_probs": [list(x) for x in rollout_lp] if rollout_lp is not None else [[] for _ in responses],
        "rewards": [float(r) for r in rewards],
        "weight_versions": [0] * n,
    }


def toy_batch():
    # two prompt groups of 4; responses of different lengths (padding), a masked token
    return make_batch(
        responses=[[D(2), EOS], [D(3), EOS], [D(2), D(2), EOS], [D(5)], [D(4), EOS], [D(7), D(1), EOS],
                   [D(4)], [D(9), EOS]],
        rewards=[1, 0, 1, 0, 1, 0, 1, 0], groups=[0, 0, 0, 0, 1, 1, 1, 1],
        prompt=[(BOS, D(1), PLUS, D(1), EQ)] * 4 + [(BOS, D(2), PLUS, D(2), EQ, D(0))] * 4,
        masks=[[1, 1], [1, 1], [1, 0, 1], [1], [1, 1], [1, 1, 1], [1], [0, 1]])


def backend_for(args) -> TorchBackend:
    b = TorchBackend(args, 0, 1)
    b.init()
    return b


def weights(b: TorchBackend) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().cpu() for k, v in b.named_weights()}


def hf_reference_log_probs(model_dir, batch, temperature=1.0):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for toks, p, r in zip(batch["tokens"], batch["prompt_lengths"], batch["response_lengths"]):
            logits = m(torch.tensor([toks])).logits[0].float() / temperature
            logp = torch.log_softmax(logits, -1)[p - 1:p + r - 1]
            out.append(logp.gather(-1, torch.tensor(toks[p:p + r])[:, None])[:, 0])
    return out


# -- log-probs ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_equal_plain_hf_forward(tmp_path, tiny_dir, temperature):
    args = make_args(tmp_path, tiny_dir, micro_batch_size=8, rollout_temperature=temperature)
    b = backend_for(args)
    batch = toy_batch()
    lps, ents = b.compute_log_probs(batch, with_entropy=True)
    want = hf_reference_log_probs(tiny_dir, batch, temperature)
    for i, (got, ref) in enumerate(zip(lps, want)):
        assert got.dtype == torch.float32 and got.device.type == "cpu"
        assert got.shape == (batch["response_lengths"][i],)
        assert (got - ref).abs().max().item() <= 1e-6, i
    assert all(e.shape == lp.shape and (e > 0).all() for e, lp in zip(ents, lps))


def test_padding_invariance_and_dynamic_batches(tmp_path, tiny_dir):
    batch = toy_batch()
    alone = backend_for(make_args(tmp_path, tiny_dir, micro_batch_size=1)).compute_log_probs(batch)[0]
    padded = backend_for(make_args(tmp_path, tiny_dir, micro_batch_size=8)).compute_log_probs(batch)[0]
    dyn = backend_for(make_args(tmp_path, tiny_dir, use_dynamic_batch_size=True, max_tokens_per_gpu=16)
                      ).compute_log_probs(batch)[0]
    for a, p, d in zip(alone, padded, dyn):
        assert (a - p).abs().max().item() <= 1e-6
        assert (a - d).abs().max().item() <= 1e-6


def test_greedy_temperature_means_one(tmp_path, tiny_dir):
    batch = toy_batch()
    t0 = backend_for(make_args(tmp_path, tiny_dir, rollout_temperature=0)).compute_log_probs(batch)[0]
    t1 = backend_for(make_args(tmp_path, tiny_dir)).compute_log_probs(batch)[0]
    assert all(torch.equal(a, c) for a, c in zip(t0, t1))


# -- gradients ----------------------------------------------------------------------------------------------
def _grads_after(b: TorchBackend, args, batch, micro: list[list[int]], advantages) -> dict[str, torch.Tensor]:
    work = _prepare(batch)
    work["old_log_probs"] = b.compute_log_probs(work)[0]
    work["advantages"] = [torch.full((r,), float(a)) for r, a in zip(work["response_lengths"], advantages)]
    per_token = args.algorithm.calculate_per_token_loss
    denom = sum(float(m.sum()) for m in work["loss_masks"]) if per_token else len(work["tokens"])
    b.train_micro_batches([select(work, idx) for idx in micro], make_policy_loss_fn(args.algorithm, denom, 1))
    g = {n: p.grad.detach().clone() for n, p in b._raw_model.named_parameters()}
    b.optimizer.zero_grad(set_to_none=True)
    return g


@pytest.mark.parametrize("per_token", [False, True])
def test_micro_batch_accumulation_matches_one_batch(tmp_path, tiny_dir, per_token):
    args = make_args(tmp_path, tiny_dir, calculate_per_token_loss=per_token, entropy_coef=0.01)
    b = backend_for(args)
    batch = toy_batch()
    adv = [1.0, -0.5, 0.25, -1.0, 2.0, 0.5, -0.75, -1.5]
    one = _grads_after(b, args, batch, [list(range(8))], adv)
    many = _grads_after(b, args, batch, [[0], [1, 2, 3], [4, 5], [6, 7]], adv)
    assert max(g.abs().max().item() for g in one.values()) > 1e-3   # a real gradient
    for name in one:
        torch.testing.assert_close(many[name], one[name], atol=2e-7, rtol=1e-5, msg=name)
    # the scale matters: a per-sample loss over a wrong denominator would differ
    half = _grads_after(b, args, select(batch, [0, 1, 2, 3]), [[0, 1, 2, 3]], adv[:4])
    assert any((half[n] - one[n]).abs().max() > 1e-5 for n in one)


# -- distributed: 2 ranks over gloo vs 1 rank on the union --------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shard(batch, rank, world):
    """Rank `rank`'s shard: a contiguous slice of whole groups."""
    n = len(batch["tokens"])
    per_rank = n // world
    return select(batch, list(range(rank * per_rank, (rank + 1) * per_rank)))


def _union_order(n, world, num_steps):
    """The union batch ordered so that step s of one rank holds step s of every rank of the sharded run."""
    per_rank, out = n // world, []
    chunk = per_rank // num_steps
    for s in range(num_steps):
        for r in range(world):
            out += list(range(r * per_rank + s * chunk, r * per_rank + (s + 1) * chunk))
    return out


def compare_with_sgd(b: TorchBackend) -> TorchBackend:
    """Give the backend SGD with momentum for an equivalence test. The parallel layouts compute the same gradients
    up to the last bits (another summation order: gloo's all-reduce, FSDP's reduce-scatter, the CPU's kernels);
    Adam's first steps are ~lr * sign(g), so where a gradient is ~0 those bits become steps of up to ~lr -- the
    1-vs-2-rank comparison then depends on the machine. SGD's step is linear in the gradient: last-bit
    differences stay last-bit, and momentum keeps optimizer state to save, load and compare."""
    b.optimizer = torch.optim.SGD([p for p in b.model.parameters() if p.requires_grad], lr=b.cfg.train.lr,
                                  momentum=0.9)
    return b


def add_last_bit_noise(b: TorchBackend, seed: int = 1000, rel: float = 2.0 ** -21) -> None:
    """Before each optimizer step, add to every gradient element +-rel x the tensor's largest magnitude: the size
    of a rounding difference when another CPU's kernels sum in another order (such an error scales with the terms
    summed, not with the small result, so it can flip the sign of a gradient near 0). The same on every rank:
    a machine's all-reduce gives every rank the same sums."""
    gen = torch.Generator().manual_seed(seed)
    step = b.optimizer.step

    def noisy_step(*a, **k):
        with torch.no_grad():
            for p in b.model.parameters():
                if p.grad is not None:
                    g = getattr(p.grad, "_local_tensor", p.grad)  # FSDP2: this rank's shard of a DTensor
                    sign = torch.randint(0, 2, g.shape, generator=gen, dtype=g.dtype) * 2 - 1
                    g.add_(rel * float(g.abs().max()) * sign)
        return step(*a, **k)
    b.optimizer.step = noisy_step


def _dist_worker(rank, world, port, args_dict, out_dir):
    import traceback

    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from datetime import timedelta
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))

    def reached(phase: str) -> None:   # where this rank was, should it die without a Python error (join_ranks)
        with open(os.path.join(out_dir, f"rank-{rank}.phase"), "w") as f:
            f.write(phase)
    try:
        reached("init")
        args = JobConfig.from_dict(args_dict)
        b = TorchBackend(args, rank, world)
        b.init()
        compare_with_sgd(b)
        add_last_bit_noise(b)
        batch = _shard(toy_batch(), rank, world)
        reached("rl_update")
        metrics = rl_update(b, args, batch, 0)
        reached("weights")
        w = weights(b)   # collective under FSDP: every rank gathers
        reached("save")
        b.save(os.path.join(out_dir, "ckpt"))
        reached("load")
        b.load(os.path.join(out_dir, "ckpt"))
        reached("weights after load")
        assert all(torch.equal(w[k], v) for k, v in weights(b).items())
        if rank == 0:
            torch.save({"weights": w, "metrics": metrics}, os.path.join(out_dir, "result.pt"))
        # leave together: a rank that tore its group down while the other still used it made gloo's background
        # thread abort the other (SIGABRT, "terminate called without an active exception"; seen once in CI-like runs)
        reached("barrier")
        dist.barrier()
        reached("done")
    except BaseException:
        with open(os.path.join(out_dir, f"rank-{rank}.error"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def join_ranks(ctx, out_dir, what: str, timeout: float = 120.0) -> None:
    """Wait for the ranks of `ctx` (torch.multiprocessing); on a failure, fail naming where each rank was and any
    Python error each raised -- one rank's abort (gloo's, when the other left the group) hides the other's error in
    torch's own report (a rank aborted right after loading the checkpoint, once, under load)."""
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:   # e.g. ranks out of step in a collective: fail instead of hanging
                for p in ctx.processes:
                    p.kill()
                pytest.fail(f"{what} did not finish within {timeout:.0f} s{_ranks_said(out_dir)}")
    except Exception as exc:   # (ProcessExitedException / ProcessRaisedException)
        pytest.fail(f"{what} failed: {exc}{_ranks_said(out_dir)}")


def _ranks_said(out_dir) -> str:
    import glob
    said = []
    paths = glob.glob(os.path.join(out_dir, "rank-*.phase")) + glob.glob(os.path.join(out_dir, "rank-*.error"))
    for path in sorted(paths):
        with open(path) as f:
            said.append(f"\n--- {os.path.basename(path)}: {f.read()}")
    return "".join(said)


def _run_distributed(tmp_path, tiny_dir, parallel, **extra):
    import torch.multiprocessing as mp
    args = make_args(tmp_path, tiny_dir, rollout_batch_size=4, n_samples_per_prompt=2, actor_num_gpus_per_node=2,
                     global_batch_size=4, micro_batch_size=1, torch_parallel=parallel, use_kl_loss=True,
                     kl_loss_coef=0.1, entropy_coef=0.01, lr=1e-2, **extra)
    assert args.train.num_steps_per_rollout == 2
    out = tmp_path / f"dist-{parallel}"
    out.mkdir()
    ctx = mp.start_processes(_dist_worker, args=(2, _free_port(), args.to_dict(), str(out)), nprocs=2, join=False,
                             start_method="spawn")
    join_ranks(ctx, out, f"2-rank {parallel} run")
    dist_result = torch.load(out / "result.pt", weights_only=True)
    # one rank, the union batch in the order whose steps hold the same samples
    single = compare_with_sgd(backend_for(args))
    union = select(toy_batch(), _union_order(8, 2, 2))
    m1 = rl_update(single, args, union, 0)
    # the 2-rank checkpoint loads into 1 rank (full state in HF names, optimizer keyed by parameter names)
    resumed = compare_with_sgd(backend_for(args))
    resumed.load(str(out / "ckpt"))
    assert all(torch.equal(dist_result["weights"][k], v) for k, v in weights(resumed).items())
    assert len(resumed.optimizer.state) == len(single.optimizer.state) > 0
    return dist_result, weights(single), m1


@pytest.mark.parametrize("parallel,extra", [
    ("ddp", {}),
    # token budget 15: rank 0's first step fits one micro-batch (7 + 7 tokens), rank 1's needs two (8, 9), so
    # rank 0 pads with an empty one -- FSDP needs the same number of forwards on every rank
    ("fsdp", {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 15}),
])
def test_two_rank_gloo_matches_one_rank(tmp_path, tiny_dir, parallel, extra):
    """2 ranks (DDP / FSDP2 over gloo) train to the weights and metrics of 1 rank on the union batch, and their
    checkpoint loads into 1 rank. Compared after SGD steps, with the 2-rank gradients perturbed in their last bits
    as another CPU would (compare_with_sgd, add_last_bit_noise): with Adam the same perturbation fails the
    comparison (model.embed_tokens.weight, q_proj beyond 1e-5) -- as it did on another x86 machine."""
    dist_result, w1, m1 = _run_distributed(tmp_path, tiny_dir, parallel, **extra)
    w2, m2 = dist_result["weights"], dist_result["metrics"]
    init = {k: v for k, v in weights(backend_for(make_args(tmp_path, tiny_dir))).items()}
    assert set(w2) == set(w1)
    moved = max((w1[k] - init[k]).abs().max().item() for k in w1)
    assert moved > 1e-3
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], atol=1e-5, rtol=1e-4, msg=k)
    for k in ("loss", "pg_loss", "kl_loss", "entropy", "grad_norm", "adv_mean", "reward_mean"):
        assert abs(m1[k] - m2[k]) <= 1e-4 * max(1.0, abs(m1[k])), (k, m1[k], m2[k])


def test_rl_update_dynamic_micro_batches_match_one_micro_batch(tmp_path, tiny_dir):
    out = []
    for extra in ({"micro_batch_size": 8}, {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 17}):
        args = make_args(tmp_path, tiny_dir, rollout_batch_size=4, global_batch_size=8, use_kl_loss=True,
                         kl_loss_coef=0.1, entropy_coef=0.01, calculate_per_token_loss=True, **extra)
        b = backend_for(args)
        m = rl_update(b, args, toy_batch(), 0)
        out.append((weights(b), m))
    (w1, m1), (w2, m2) = out
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], atol=1e-5, rtol=1e-5, msg=k)   # Adam: lr 1e-3 per element
    assert abs(m1["grad_norm"] - m2["grad_norm"]) < 1e-5 * m1["grad_norm"]


def test_a_packed_batch_trains_exactly_as_its_lists(tmp_path, tiny_dir):
    """The trainer's batch comes packed (get_batch(packed=True), backends/batching.unpack_batch): the update, its
    metrics and the weights after it are those of the same batch as lists -- with truncated importance sampling on,
    which reads the rollout log-probs, and a masked token."""
    from slime_actors.types import pack_rows
    lps = [[-0.3 - 0.01 * i - 0.001 * j for j in range(len(r))] for i, r in enumerate(toy_batch()["loss_masks"])]
    out = []
    for packed in (False, True):
        torch.manual_seed(0)
        args = make_args(tmp_path, tiny_dir, rollout_batch_size=4, global_batch_size=8, micro_batch_size=8,
                         use_tis=True)
        b = backend_for(args)
        batch = toy_batch()
        batch["rollout_log_probs"] = [list(x) for x in lps]
        if packed:   # (as the trainer passes it on: rl_update unpacks it)
            batch = {**batch, "tokens": pack_rows(batch["tokens"], "int"),
                     "loss_masks": pack_rows(batch["loss_masks"], "mask"),
                     "rollout_log_probs": pack_rows(batch["rollout_log_probs"], "float32")}
        m = rl_update(b, args, batch, 0)
        out.append((weights(b), {k: v for k, v in m.items() if "time" not in k}))
    (w1, m1), (w2, m2) = out
    assert m1 == m2
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


# -- learning -----------------------------------------------------------------------------------------------
def test_rl_update_increases_logprob_of_rewarded_responses(tmp_path, tiny_dir):
    args = make_args(tmp_path, tiny_dir, rollout_batch_size=1, n_samples_per_prompt=4, lr=3e-3, clip_grad=1.0,
                     use_tis=True, use_kl_loss=True, kl_loss_coef=0.01, kl_loss_type="low_var_kl")
    b = backend_for(args)
    good, bad = [D(2), EOS], [D(3), EOS]

    def batch_now():
        bt = make_batch([good, bad, good, bad], [1, 0, 1, 0])
        lp = b.compute_log_probs(bt)[0]
        bt["rollout_log_probs"] = [x.tolist() for x in lp]
        return bt, lp

    bt, lp0 = batch_now()
    for step in range(4):
        metrics = rl_update(b, args, bt, step)
        bt, _ = batch_now()
        if step == 0:
            assert metrics["train_rollout_logprob_abs_diff_max"] <= 1e-6
            assert metrics["reward_mean"] == 0.5 and metrics["num_samples"] == 4
            assert metrics["tis_clipfrac"] == 0.0
            for k in ("loss", "pg_loss", "pg_clipfrac", "ppo_kl", "kl_loss", "entropy", "grad_norm", "adv_mean",
                      "adv_std", "response_len_mean", "train_rollout_logprob_abs_diff", "tis"):
                assert k in metrics and isinstance(metrics[k], float), k
    lp1 = b.compute_log_probs(bt)[0]
    assert lp1[0].sum() > lp0[0].sum() + 0.5      # rewarded response: more likely
    assert lp1[1].sum() < lp0[1].sum() - 0.5      # unrewarded: less likely


@pytest.mark.parametrize("estimator", ["ppo", "reinforce_plus_plus", "gspo"])
def test_other_estimators_run(tmp_path, tiny_dir, estimator):
    extra = {"kl_coef": 0.05} if estimator != "gspo" else {}
    args = make_args(tmp_path, tiny_dir, advantage_estimator=estimator, lr=1e-2, gamma=0.9, lambd=0.95, **extra)
    b = backend_for(args)
    batch = make_batch([[D(2), EOS], [D(3), EOS], [D(2), D(4)], [D(1)]], [1, 0, 1, 0], groups=[0, 0, 1, 1])
    w0 = weights(b)
    m = rl_update(b, args, batch, 0)
    assert all(torch.isfinite(torch.tensor(v)) for v in m.values())
    assert len(batch["advantages"]) == 4 and batch["advantages"][2].shape == (2,)
    if estimator == "ppo":
        assert "value_loss" in m and "critic_grad_norm" in m
        assert b.critic is not None and all(v.shape == (r,) for v, r in zip(batch["values"],
                                                                              batch["response_lengths"]))
    if extra:
        assert "ref_kl" in m   # kl_coef > 0 needs the reference model
    assert any(not torch.equal(w0[k], v) for k, v in weights(b).items())


# -- checkpoints --------------------------------------------------------------------------------------------
def test_exact_resume(tmp_path, tiny_dir):
    args = make_args(tmp_path, tiny_dir, use_kl_loss=True, kl_loss_coef=0.1, lr=1e-2, clip_grad=1.0,
                     micro_batch_size=2, global_batch_size=4, rollout_batch_size=4)
    batch = toy_batch
    a = backend_for(args)
    for k in range(2):
        rl_update(a, args, batch(), k)
    a.weight_version = 2
    ckpt = tmp_path / "ckpt"
    a.save(str(ckpt))
    r_a = torch.rand(3)
    rl_update(a, args, batch(), 2)
    wa = weights(a)

    b = backend_for(args)
    w_init = weights(b)
    b.load(str(ckpt))
    assert b.weight_version == 2
    assert torch.equal(torch.rand(3), r_a)      # RNG state restored
    rl_update(b, args, batch(), 2)
    wb = weights(b)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert any(not torch.equal(w_init[k], wb[k]) for k in wb)
    # without the optimizer state the next step differs (Adam moments matter), so the test can fail
    c = backend_for(args)
    c.load(str(ckpt), load_optim=False)
    rl_update(c, args, batch(), 2)
    assert any(not torch.equal(wa[k], v) for k, v in weights(c).items())


def test_named_weights_and_save_hf(tmp_path, tiny_dir):
    from transformers import AutoModelForCausalLM
    args = make_args(tmp_path, tiny_dir, lr=1e-2)
    b = backend_for(args)
    rl_update(b, args, toy_batch(), 0)
    names = dict(b.named_weights())
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir)
    expected = {n for n, _ in hf.named_parameters()}
    assert set(names) == expected                     # HF names; the tied lm_head is not repeated
    out = tmp_path / "hf"
    b.save_hf(str(out))
    m = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    for n, p in m.named_parameters():
        assert torch.equal(p.detach(), names[n]), n
    assert (out / "tokenizer.json").exists() or (out / "tokenizer_config.json").exists()
    # bf16 (mixed precision: tests/test_torch_mixed_precision.py) keeps fp32 weights and computes fp32 log-probs
    b16 = backend_for(make_args(tmp_path, tiny_dir, bf16=True))
    lp = b16.compute_log_probs(toy_batch())[0]
    assert lp[0].dtype == torch.float32 and next(b16._raw_model.parameters()).dtype == torch.float32


# -- bad inputs ---------------------------------------------------------------------------------------------
def test_bad_inputs_name_the_sample(tmp_path, tiny_dir):
    args = make_args(tmp_path, tiny_dir, use_tis=True)
    b = backend_for(args)

    def good():
        bt = toy_batch()
        bt["rollout_log_probs"] = [[-1.0] * r for r in bt["response_lengths"]]
        return bt

    bt = good()
    bt["response_lengths"][3] = 2
    with pytest.raises(ValueError, match=r"sample 3 \(sample_index=3\): 6 tokens != prompt_length 5"):
        b.compute_log_probs(bt)
    with pytest.raises(ValueError, match=r"sample 3 \(sample_index=3\)"):
        rl_update(b, args, bt, 0)
    bt = good()
    bt["loss_masks"][5] = [1]
    with pytest.raises(ValueError, match=r"sample 5 \(sample_index=5\).*loss_mask"):
        rl_update(b, args, bt, 0)
    bt = good()
    bt["prompt_lengths"][2], bt["response_lengths"][2] = 0, 8
    bt["loss_masks"][2] = [1] * 8
    bt["rollout_log_probs"][2] = [-1.0] * 8
    with pytest.raises(ValueError, match=r"sample 2 \(sample_index=2\): prompt_length 0"):
        rl_update(b, args, bt, 0)
    bt = toy_batch()   # --use-tis needs the rollout log-probs
    with pytest.raises(ValueError, match=r"sample 0 .*rollout_log_probs"):
        rl_update(b, args, bt, 0)
    with pytest.raises(ValueError, match="reference"):
        b.compute_log_probs(good(), model="ref")
    rl_update(b, args, good(), 0)   # and the good batch trains


def test_tf32_switch_is_torchs_matmul_precision_and_the_trainer_sets_it_on_a_gpu(monkeypatch):
    """--tf32 sets torch's process-wide fp32 matmul precision to "high" (TF32 on a GPU); off leaves torch's default.
    The trainer asks it for a GPU job only, before its backend builds a model."""
    import inspect

    from slime_actors.actors import trainer
    from slime_actors.backends.training import set_tf32
    from slime_actors.config import parse_config
    asked: list[str] = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", asked.append)
    set_tf32(False)
    assert asked == []
    set_tf32(True)
    assert asked == ["high"]
    job = ["--config", str(Path(__file__).resolve().parents[1] / "examples" / "digits" / "config.toml")]
    assert parse_config([*job, "--tf32"]).train.tf32 and not parse_config(job).train.tf32
    src = inspect.getsource(trainer.TrainerRank._init)
    assert src.index('set_tf32(cfg.train.tf32 and cfg.run.device == "cuda")') < src.index("self.backend.init()")
