"""--bf16 on the torch backend is mixed precision (as Megatron's --bf16 and transformers' bf16=True): the weights that
train and AdamW's states stay fp32, the forwards run under bf16 autocast, log-probs are fp32, the engines get bf16.
On CPU with the tiny model: CPU autocast runs the same bf16 matmuls a GPU's would (in other kernels), so these
check where each dtype is, not a GPU's numbers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from slime_actors.backends.rl_update import rl_update
from tests.test_torch_backend import D, EOS, backend_for, make_args, make_batch, tiny_dir, toy_batch  # noqa: F401


def _linear_input_dtypes(module: nn.Module) -> tuple[list[torch.dtype], list]:
    """The dtypes the Linear layers compute in (their outputs', which autocast sets), recorded by forward hooks."""
    seen: list[torch.dtype] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
             for m in module.modules() if isinstance(m, nn.Linear)]
    return seen, hooks


def _batch_with_rollout_log_probs(b, responses, rewards):
    bt = make_batch(responses, rewards)
    bt["rollout_log_probs"] = [x.tolist() for x in b.compute_log_probs(bt)[0]]
    return bt


def test_bf16_keeps_fp32_weights_and_optimizer_states_and_computes_in_bf16(tmp_path, tiny_dir):
    args = make_args(tmp_path, tiny_dir, bf16=True, rollout_batch_size=1, n_samples_per_prompt=4)
    b = backend_for(args)
    assert all(p.dtype == torch.float32 for p in b._raw_model.parameters())
    seen, hooks = _linear_input_dtypes(b._raw_model)
    lps, ents = b.compute_log_probs(toy_batch(), with_entropy=True)
    assert seen and set(seen) == {torch.bfloat16}, "the log-prob forward's matmuls ran in bf16"
    assert all(x.dtype == torch.float32 for x in lps + ents)
    seen.clear()
    bt = _batch_with_rollout_log_probs(b, [[D(2), EOS], [D(3), EOS], [D(2), EOS], [D(3), EOS]], [1, 0, 1, 0])
    seen.clear()
    m = rl_update(b, args, bt, 0)
    for h in hooks:
        h.remove()
    assert set(seen) == {torch.bfloat16}, "the training forward's matmuls ran in bf16"
    # the log-prob forward and the training forward compute the same numbers (both under autocast)
    assert m["train_rollout_logprob_abs_diff_max"] <= 1e-6
    state = [s for s in b.optimizer.state.values()]
    assert state and all(s["exp_avg"].dtype == torch.float32 and s["exp_avg_sq"].dtype == torch.float32
                         for s in state)
    assert all(p.dtype == torch.float32 for p in b._raw_model.parameters())


def test_bf16_keeps_an_update_below_bf16s_resolution(tmp_path, tiny_dir):
    """The reason for fp32 master weights: at lr 1e-5 Adam moves each weight by ~1e-5, below bf16's resolution for
    weights of magnitude > ~1e-3 (8 bits of mantissa): pure bf16 weights would not move; fp32 ones do."""
    args = make_args(tmp_path, tiny_dir, bf16=True, lr=1e-5, rollout_batch_size=1, n_samples_per_prompt=4)
    b = backend_for(args)
    before = {n: p.detach().clone() for n, p in b._raw_model.named_parameters()}
    bt = _batch_with_rollout_log_probs(b, [[D(2), EOS], [D(3), EOS], [D(2), EOS], [D(3), EOS]], [1, 0, 1, 0])
    rl_update(b, args, bt, 0)
    moved = lost = total = 0
    for n, p in b._raw_model.named_parameters():
        w0, w1 = before[n], p.detach()
        changed = w1 != w0
        moved += int(changed.sum())
        # of the changed elements, those whose change a bf16 weight could not hold (it rounds back to w0)
        lost += int((changed & (w1.to(torch.bfloat16) == w0.to(torch.bfloat16))).sum())
        total += w0.numel()
    assert moved > total // 2, f"only {moved} of {total} weights moved"
    assert lost > moved // 2, "the test's premise: most of this step is below bf16's resolution"


def test_bf16_gives_the_engines_and_save_hf_bf16_and_checkpoints_fp32(tmp_path, tiny_dir):
    from safetensors.torch import load_file
    args = make_args(tmp_path, tiny_dir, bf16=True, lr=1e-2)
    b = backend_for(args)
    rl_update(b, args, toy_batch(), 0)
    sent = dict(b.named_weights())
    raw = {n: p.detach() for n, p in b._raw_model.named_parameters()}
    assert sent and all(t.dtype == torch.bfloat16 for t in sent.values())
    for n, t in sent.items():
        assert torch.equal(t, raw[n].to(torch.bfloat16)), n   # the master weights, rounded once
    b.save_hf(str(tmp_path / "hf"))
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in exported.values())
    b.save(str(tmp_path / "ckpt"))
    c = backend_for(args)
    c.load(str(tmp_path / "ckpt"))
    for n, p in c._raw_model.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p.detach(), raw[n]), n   # resumed from the fp32 masters


def test_bf16_with_a_reference_model_and_a_critic(tmp_path, tiny_dir):
    """KL's reference forward computes what the actor's does before training (both fp32 weights under autocast:
    KL 0 at step 0); PPO's critic trains in fp32 and its values come out fp32."""
    args = make_args(tmp_path, tiny_dir, bf16=True, advantage_estimator="ppo", kl_coef=0.05, use_kl_loss=True,
                     kl_loss_coef=0.1, lr=1e-3)
    b = backend_for(args)
    assert all(p.dtype == torch.float32 for p in b.ref_model.parameters())
    assert all(p.dtype == torch.float32 for p in b._raw_critic.parameters())
    batch = toy_batch()
    actor, _ = b.compute_log_probs(batch)
    ref, _ = b.compute_log_probs(batch, model="ref")
    assert all(torch.equal(a, r) for a, r in zip(actor, ref))
    values = b.compute_values(batch)
    assert all(v.dtype == torch.float32 for v in values)
    m = rl_update(b, args, toy_batch(), 0)
    assert all(torch.isfinite(torch.tensor(v)) for v in m.values())
    assert "value_loss" in m and "ref_kl" in m


def test_bf16_lora_holds_the_frozen_base_in_bf16_and_trains_fp32_adapters(tmp_path, tiny_dir):
    pytest.importorskip("peft")
    args = make_args(tmp_path, tiny_dir, bf16=True, lora_rank=4, lora_alpha=8, lr=1e-2, use_kl_loss=True,
                     kl_loss_coef=0.1)
    b = backend_for(args)
    frozen = [p for p in b._raw_model.parameters() if not p.requires_grad]
    trained = [p for p in b._raw_model.parameters() if p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert trained and all(p.dtype == torch.float32 for p in trained)
    seen: list[torch.dtype] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
             for n, m in b._raw_model.named_modules() if n.endswith("lora_A.default")]
    b.compute_log_probs(toy_batch())
    for h in hooks:
        h.remove()
    assert hooks and set(seen) == {torch.bfloat16}, "the adapters' matmuls run under autocast (peft alone: fp32)"
    before = {k: v.clone() for k, v in b.adapter_weights().items()}
    m = rl_update(b, args, toy_batch(), 0)
    assert torch.isfinite(torch.tensor(m["loss"]))
    after = b.adapter_weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(t.dtype == torch.bfloat16 for _, t in b.named_weights())   # merged, for the engines


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_bf16_trains_across_two_ranks_and_its_checkpoint_round_trips(tmp_path, tiny_dir, parallel):
    """DDP / FSDP2 over gloo with --bf16: autocast inside the wrapped (sharded) model, fp32 gradients averaged
    (reduce-scattered), the checkpoint saved and loaded back bit for bit on each rank (tests/test_torch_backend.py's
    worker). Near the one-rank run on the union batch -- not equal: the ranks' micro-batches pad to other shapes,
    and bf16 matmuls of other shapes round differently."""
    import torch.multiprocessing as mp

    from slime_actors.backends.batching import select
    from tests.test_torch_backend import (_dist_worker, _free_port, _union_order, backend_for as one_rank,
                                          join_ranks, weights)
    extra = {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 15} if parallel == "fsdp" else {}
    args = make_args(tmp_path, tiny_dir, bf16=True, rollout_batch_size=4, n_samples_per_prompt=2,
                     actor_num_gpus_per_node=2, global_batch_size=4, micro_batch_size=1, torch_parallel=parallel,
                     use_kl_loss=True, kl_loss_coef=0.1, lr=1e-2, **extra)
    out = tmp_path / "dist"
    out.mkdir()
    ctx = mp.start_processes(_dist_worker, args=(2, _free_port(), args.to_dict(), str(out)), nprocs=2, join=False,
                             start_method="spawn")
    join_ranks(ctx, out, f"2-rank {parallel} --bf16 run")
    result = torch.load(out / "result.pt", weights_only=True)
    w2, m2 = result["weights"], result["metrics"]
    assert all(t.dtype == torch.bfloat16 for t in w2.values())          # named_weights: what the engines get
    from tests.test_torch_backend import compare_with_sgd
    single = compare_with_sgd(one_rank(args))
    m1 = rl_update(single, args, select(toy_batch(), _union_order(8, 2, 2)), 0)
    w1 = weights(single)
    init = weights(one_rank(make_args(tmp_path, tiny_dir, bf16=True)))
    moved = max((w1[k].float() - init[k].float()).abs().max().item() for k in w1)
    assert moved > 1e-3
    # the two-rank update is the one-rank update up to bf16's rounding (of the weights read, and of the matmuls)
    d1 = torch.cat([(w1[k].float() - init[k].float()).flatten() for k in sorted(w1)])
    d2 = torch.cat([(w2[k].float() - init[k].float()).flatten() for k in sorted(w1)])
    rel = float((d2 - d1).norm() / d1.norm())
    assert rel < 0.1, f"|update of 2 ranks - update of 1| / |update of 1| = {rel:.4f} (ddp: 0, fsdp: 0.02 here)"
    for k in ("loss", "pg_loss", "kl_loss", "grad_norm", "reward_mean"):
        assert abs(m1[k] - m2[k]) <= 5e-2 * max(1.0, abs(m1[k])), (k, m1[k], m2[k])


def test_a_checkpoint_of_the_old_pure_bf16_backend_resumes_in_fp32(tmp_path, tiny_dir):
    """Before mixed precision, --bf16 saved bf16 weights and bf16 Adam states: such a checkpoint (made here by
    casting a saved one) loads into the fp32 parameters and optimizer, the values those bf16 numbers are."""
    from safetensors.torch import load_file, save_file
    args = make_args(tmp_path, tiny_dir, bf16=True, lr=1e-2)
    b = backend_for(args)
    rl_update(b, args, toy_batch(), 0)
    ckpt = tmp_path / "ckpt"
    b.save(str(ckpt))
    old = {k: v.to(torch.bfloat16) for k, v in load_file(str(ckpt / "model.safetensors")).items()}
    save_file(old, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    osd = torch.load(ckpt / "optim.pt", weights_only=True)
    for st in osd["state"].values():
        for key in ("exp_avg", "exp_avg_sq"):
            st[key] = st[key].to(torch.bfloat16)
    torch.save(osd, ckpt / "optim.pt")
    c = backend_for(args)
    c.load(str(ckpt))
    params = dict(c._raw_model.named_parameters())
    for n, t in old.items():
        assert params[n].dtype == torch.float32 and torch.equal(params[n].detach(), t.float()), n
    assert all(s["exp_avg"].dtype == torch.float32 for s in c.optimizer.state.values())
    m = rl_update(c, args, toy_batch(), 1)
    assert torch.isfinite(torch.tensor(m["loss"]))
