"""slime's losses: the cispo estimator, --loss-type sft_loss and custom_loss (--custom-loss-function-path), and
pass@k (--log-passrate); on CPU with the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from slime_actors.config import ConfigError
from slime_actors.algo.losses import compute_cispo_loss, compute_policy_loss
from slime_actors.algo.passrate import pass_at_k
from slime_actors.backends.rl_update import rl_update
from test_torch_backend import D, EOS, backend_for, make_args, make_batch, tiny_dir, toy_batch, weights  # noqa: F401

torch.set_num_threads(1)


# -- cispo --------------------------------------------------------------------------------------------------
def test_cispo_truncates_the_ratio_but_keeps_the_gradient():
    """CISPO (MiniMax-M1): -sg(clip(r, 1 - eps, 1 + eps_high)) * A * logp. PPO's clip zeroes the gradient of a
    token whose ratio is clipped; CISPO's does not."""
    lp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    old = torch.tensor([-1.0, -2.5, -1.5])          # ratios exp(lp - old): 1, e^0.5 (1.65), e (2.72)
    adv = torch.tensor([1.0, -1.0, 2.0])
    losses, clipfrac = compute_cispo_loss(old - lp, lp, adv, eps_clip=0.2, eps_clip_high=0.28)
    ratio = torch.exp(lp.detach() - old)
    trunc = ratio.clamp(0.8, 1.28)
    assert torch.allclose(losses, -trunc * adv * lp.detach())
    assert clipfrac.tolist() == [0.0, 1.0, 1.0]     # the last two above 1 + 0.28
    losses.sum().backward()
    assert torch.allclose(lp.grad, -trunc * adv)   # d/dlogp: the truncated ratio (a constant) times -A
    assert (lp.grad != 0).all()                     # every token gets gradient, the truncated ones too
    lp2 = lp.detach().clone().requires_grad_(True)
    ppo, _ = compute_policy_loss(old - lp2, adv, 0.2, 0.28)
    ppo.sum().backward()
    assert lp2.grad[2] == 0 and lp2.grad[0] != 0    # PPO: the clipped token (ratio 2.7 with A > 0) gets none


def test_cispo_clipfrac_counts_the_truncated_tokens():
    lp = torch.tensor([0.0, 0.0, 0.0])
    old = torch.tensor([0.0, 0.5, -0.5])            # ratios 1, e^-0.5 = 0.61, e^0.5 = 1.65
    _, clipfrac = compute_cispo_loss(old - lp, lp, torch.ones(3), eps_clip=0.2, eps_clip_high=0.28)
    assert clipfrac.tolist() == [0.0, 1.0, 1.0]
    _, clipfrac = compute_cispo_loss(old - lp, lp, torch.ones(3), eps_clip=1.0, eps_clip_high=4.0)
    assert clipfrac.tolist() == [0.0, 0.0, 0.0]     # canonical CISPO: one-sided, wide


def test_cispo_trains_and_differs_from_grpo(tmp_path, tiny_dir):
    """cispo takes grpo's advantages but its own loss: the first step (ratio 1, nothing truncated) moves the weights
    as grpo's does (the same gradient: -A * dlogp), a later off-policy step does not."""
    moved = {}
    for est in ("grpo", "cispo"):
        args = make_args(tmp_path / est, tiny_dir, advantage_estimator=est, lr=1e-2, num_steps_per_rollout=2,
                         rollout_batch_size=2, n_samples_per_prompt=4, global_batch_size=4, eps_clip=0.01,
                         eps_clip_high=0.01)
        b = backend_for(args)
        w0 = weights(b)
        m = rl_update(b, args, toy_batch(), 0)
        assert math.isfinite(m["loss"]) and 0.0 <= m["pg_clipfrac"] <= 1.0
        moved[est] = {k: v - w0[k] for k, v in weights(b).items()}
    # the second mini-batch step is off-policy (the first step moved the weights): tiny clip ranges truncate
    # there, so PPO drops those tokens' gradient while CISPO keeps it -- the updates differ
    diff = max((moved["grpo"][k] - moved["cispo"][k]).abs().max().item() for k in moved["grpo"])
    assert diff > 1e-6


# -- sft and custom losses ----------------------------------------------------------------------------------
def test_sft_loss_raises_the_likelihood_of_every_response(tmp_path, tiny_dir):
    args = make_args(tmp_path, tiny_dir, loss_type="sft_loss", lr=1e-2, rollout_batch_size=1,
                     n_samples_per_prompt=4)
    b = backend_for(args)
    batch = make_batch([[D(2), EOS], [D(3), EOS], [D(2), EOS], [D(3), EOS]], [1, 0, 1, 0])
    lp0 = b.compute_log_probs(batch)[0]
    m = rl_update(b, args, batch, 0)
    lp1 = b.compute_log_probs(batch)[0]
    # the rewards do not matter: the unrewarded responses get likelier too (what the policy loss would not do)
    assert all(a.sum() > z.sum() for a, z in zip(lp1, lp0))
    expected = -sum(float(x.mean()) for x in lp0) / 4     # sum of per-sample means / samples
    assert m["loss"] == pytest.approx(expected, rel=1e-5) and m["pg_loss"] == pytest.approx(expected, rel=1e-5)


POLICY_AS_CUSTOM = '''
import torch

CALLS = []


def policy(args, batch, log_probs, sum_of_sample_mean):
    """The PPO clipped loss written against slime's custom-loss signature."""
    CALLS.append(sorted(batch))
    old = torch.cat(batch["log_probs"])
    lp = torch.cat(log_probs)
    adv = torch.cat(batch["advantages"])
    ratio = torch.exp(lp - old)
    pg = torch.maximum(-ratio * adv, -ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip_high) * adv)
    loss = sum_of_sample_mean(pg)
    return loss, {"pg_loss": loss.detach(), "ratio_max": ratio.max().detach()}


def not_a_loss(args, batch, log_probs, sum_of_sample_mean):
    return 1.0
'''


def test_custom_loss_gets_slimes_arguments_and_trains_like_the_builtin(tmp_path, tiny_dir, monkeypatch):
    mod = tmp_path / "my_loss.py"
    mod.write_text(POLICY_AS_CUSTOM)
    monkeypatch.syspath_prepend(str(tmp_path))
    common = dict(lr=1e-2, num_steps_per_rollout=2, rollout_batch_size=2, n_samples_per_prompt=4,
                  global_batch_size=4, micro_batch_size=2, seed=3)
    builtin = make_args(tmp_path / "a", tiny_dir, **common)
    custom = make_args(tmp_path / "b", tiny_dir, loss_type="custom_loss", custom_loss_function_path="my_loss.policy",
                       **common)
    b1, b2 = backend_for(builtin), backend_for(custom)
    m1 = rl_update(b1, builtin, toy_batch(), 0)
    m2 = rl_update(b2, custom, toy_batch(), 0)
    # the same loss, reduced through sum_of_sample_mean over micro-batches: the same update
    for k, v in weights(b1).items():
        torch.testing.assert_close(weights(b2)[k], v, atol=1e-6, rtol=1e-5, msg=k)
    assert m2["loss"] == pytest.approx(m1["loss"], abs=1e-6) and m2["pg_loss"] == pytest.approx(m1["pg_loss"], abs=1e-6)
    assert "ratio_max" in m2 and m2["ratio_max"] > 0
    import my_loss
    assert {"advantages", "log_probs", "old_log_probs", "loss_masks", "returns", "entropy", "total_lengths",
            "response_lengths", "rewards", "rollout_log_probs", "tokens"} <= set(my_loss.CALLS[0])
    bad = make_args(tmp_path / "c", tiny_dir, loss_type="custom_loss", custom_loss_function_path="my_loss.not_a_loss",
                    **common)
    with pytest.raises(TypeError, match=r"my_loss.not_a_loss: expected \(scalar loss tensor, dict of metrics\)"):
        rl_update(backend_for(bad), bad, toy_batch(), 0)
    # a path that names nothing is refused before any process starts, naming the flag and the file
    with pytest.raises(ConfigError, match=r"--custom-loss-function-path: cannot load 'my_loss.nope': .*my_loss.py "
                                          r"defines no 'nope'"):
        make_args(tmp_path / "d", tiny_dir, loss_type="custom_loss", custom_loss_function_path="my_loss.nope", **common)


# -- pass@k -------------------------------------------------------------------------------------------------
def test_pass_at_k_is_the_unbiased_estimator():
    groups = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0]]
    got = pass_at_k(groups)
    for k in (1, 2, 4):
        want = sum(1 - math.comb(4 - sum(g), k) / math.comb(4, k) for g in groups) / 3
        assert got[f"pass@{k}"] == pytest.approx(want)
    assert set(got) == {"pass@1", "pass@2", "pass@4"}
    assert pass_at_k([[1], [0]]) == {}                       # slime: groups of one give nothing
    assert pass_at_k([[0.5, 1.0], [None, 1]]) == {"pass@1": 0.5, "pass@2": 1.0}   # only reward 1 passes
