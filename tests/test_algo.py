"""Unit tests of slime_actors.algo and the batching helpers, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from slime_actors.algo.advantages import (compute_advantages_and_returns, discounted_returns, gae, masked_whiten,
                                          normalize_group_rewards, ppo_token_rewards, reinforce_plus_plus_returns)
from slime_actors.algo.kl import compute_approx_kl
from slime_actors.algo.logprobs import effective_temperature, entropy_from_logits, log_probs_from_logits
from slime_actors.algo.losses import (compute_policy_loss, compute_value_loss, gspo_ppo_kl, masked_mean,
                                      reduce_loss)
from slime_actors.algo.tis import tis_weights
from slime_actors.backends.batching import (dynamic_micro_batches, fixed_micro_batches, micro_batch_indices,
                                            mini_batch_indices, pad_tokens, select, validate_batch)


def close(a, b, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32),
                               atol=tol, rtol=0)


# -- rewards post-processing --------------------------------------------------------------------------------
def test_group_normalization_grpo_by_group_index():
    # group 0 = samples 0, 2 (rewards 1, 0); group 1 = samples 1, 3, 4 (all 3)
    r = normalize_group_rewards([1.0, 3.0, 0.0, 3.0, 3.0], [0, 1, 0, 1, 1], "grpo")
    # group 0: mean 0.5, centered +-0.5, unbiased std sqrt(0.5) = 0.70710678 -> +-0.5 / (0.70710678 + 1e-6)
    close(r, [0.7071058, 0.0, -0.7071058, 0.0, 0.0])
    assert torch.isfinite(r).all()


def test_group_normalization_variants():
    rewards, groups = [1.0, 3.0, 0.0, 3.0, 3.0], [0, 1, 0, 1, 1]
    close(normalize_group_rewards(rewards, groups, "grpo", std_normalization=False), [0.5, 0, -0.5, 0, 0])
    close(normalize_group_rewards(rewards, groups, "gspo"), [0.7071058, 0, -0.7071058, 0, 0])
    close(normalize_group_rewards(rewards, groups, "reinforce_plus_plus_baseline"), [0.5, 0, -0.5, 0, 0])
    close(normalize_group_rewards(rewards, groups, "reinforce_plus_plus"), rewards)
    close(normalize_group_rewards(rewards, groups, "ppo"), rewards)
    # a group of one sample: centered to 0, no NaN from the (undefined) unbiased std
    close(normalize_group_rewards([5.0], [0], "grpo"), [0.0])


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "reinforce_plus_plus_baseline"])
def test_identical_rewards_give_zero_advantages(estimator):
    r = normalize_group_rewards([1.0, 1.0, 1.0, 1.0], [7, 7, 7, 7], estimator)
    masks = [torch.tensor([1.0, 1.0]), torch.tensor([1.0]), torch.tensor([0.0, 1.0, 1.0]), torch.tensor([1.0])]
    adv, ret = compute_advantages_and_returns(estimator, r, masks, normalize_advantages=True)
    for a in adv:
        assert torch.isfinite(a).all()
        close(a, torch.zeros_like(a))


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("value,n", [(0.7, 8), (2.9, 8), (0.1, 7), (0.9, 3), (-1.7, 16), (0.35, 7)])
def test_identical_non_dyadic_rewards_give_exactly_zero(estimator, value, n):
    # fp32 statistics gave 0.7 x 8 -> +0.0596 each and 2.9 x 8 -> -0.238 (a mean a few ulps off, divided by eps)
    r = normalize_group_rewards([value] * n, [3] * n, estimator)
    assert torch.equal(r, torch.zeros(n)), r.tolist()
    masks = [torch.ones(1 + i % 3) for i in range(n)]
    for whiten in (False, True):
        adv, _ = compute_advantages_and_returns(estimator, r, masks, normalize_advantages=whiten)
        for a in adv:
            assert torch.equal(a, torch.zeros_like(a)), a.tolist()


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "reinforce_plus_plus_baseline"])
def test_a_constant_group_among_others_is_exactly_zero(estimator):
    # group 0: 0.7 x 8 (interleaved with group 1), group 1: mixed, group 2: 2.9 x 3
    rewards = [0.7, 0.1] * 4 + [0.7] * 4 + [0.9, 0.3, 2.9] + [2.9] * 3
    groups = [0, 1] * 4 + [0] * 4 + [1, 1, 1] + [2] * 3
    r = normalize_group_rewards(rewards, groups, estimator)
    const = [i for i, g in enumerate(groups) if g != 1]
    mixed = [i for i, g in enumerate(groups) if g == 1]
    assert torch.equal(r[const], torch.zeros(len(const))), r[const].tolist()
    assert (r[mixed] != 0).all()
    assert abs(float(r[mixed].double().sum())) < 1e-6      # group 1 still centred
    if estimator != "reinforce_plus_plus_baseline":   # (its whitening shifts every sample by the batch's mean)
        adv, _ = compute_advantages_and_returns(estimator, r, [torch.ones(2)] * len(rewards))
        for i in const:
            assert torch.equal(adv[i], torch.zeros(2))


def test_whitening_a_constant_batch_gives_exact_zeros():
    # reinforce_plus_plus (no baseline) whitens the raw rewards: a batch of one value has nothing to tell apart
    masks = [torch.ones(3), torch.tensor([0.0, 1.0]), torch.ones(1), torch.ones(3), torch.ones(2)]
    adv, _ = compute_advantages_and_returns("reinforce_plus_plus", [0.1] * 5, masks)
    for a, m in zip(adv, masks):
        assert torch.equal(a[m.bool()], torch.zeros(int(m.sum())))


# -- per-token advantages -------------------------------------------------------------------------------------
def test_grpo_broadcasts_normalized_reward():
    masks = [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0, 1.0])]
    adv, ret = compute_advantages_and_returns("grpo", [0.5, -1.0], masks)
    close(adv[0], [0.5, 0.5])
    close(adv[1], [-1.0, -1.0, -1.0])
    close(ret[1], [-1.0, -1.0, -1.0])


def test_reinforce_plus_plus_returns_hand_computed():
    # reward 1, kl = [0.1, 0.2, 0.3], mask [1, 1, 0], kl_coef 0.5, gamma 0.5
    # token rewards: -0.5 * [0.1, 0.2, 0] = [-0.05, -0.1, 0]; +1 at the last unmasked (index 1) -> [-0.05, 0.9, 0]
    # returns: G2 = 0, G1 = 0.9, G0 = -0.05 + 0.5 * 0.9 = 0.4
    kl = [torch.tensor([0.1, 0.2, 0.3])]
    mask = [torch.tensor([1.0, 1.0, 0.0])]
    ret = reinforce_plus_plus_returns(torch.tensor([1.0]), kl, mask, kl_coef=0.5, gamma=0.5)
    close(ret[0], [0.4, 0.9, 0.0])
    # through the estimator (kl = log_probs - ref, k1): advantages whitened over unmasked tokens [0.4, 0.9]:
    # mean 0.65, unbiased var 0.125, std 0.3535534 -> [-0.7071068, 0.7071068], masked token (0 - 0.65)/std
    lp, ref = [torch.tensor([-1.0, -1.0, -1.0])], [torch.tensor([-1.1, -1.2, -1.3])]
    adv, ret = compute_advantages_and_returns("reinforce_plus_plus", [1.0], mask, log_probs=lp, ref_log_probs=ref,
                                              kl_coef=0.5, kl_type="k1", gamma=0.5)
    close(ret[0], [0.4, 0.9, 0.0])
    close(adv[0], [-0.7071068, 0.7071068, -1.8384776], tol=1e-5)


def test_reinforce_plus_plus_fully_masked_sample_is_not_an_error():
    ret = reinforce_plus_plus_returns(torch.tensor([2.0]), [torch.zeros(2)], [torch.zeros(2)], 0.0, 1.0)
    close(ret[0], [2.0, 2.0])  # reward on the last token, gamma 1


def test_reinforce_plus_plus_baseline_kl_and_whitening():
    # baselined rewards [1, -1]; kl (k1) per token = [0.2, 0.4] and [0.0]; kl_coef 0.5
    # unwhitened: [1 - 0.1, 1 - 0.2] = [0.9, 0.8] and [-1.0]
    lp = [torch.tensor([0.2, 0.4]), torch.tensor([0.0])]
    ref = [torch.zeros(2), torch.zeros(1)]
    masks = [torch.ones(2), torch.ones(1)]
    adv, _ = compute_advantages_and_returns("reinforce_plus_plus_baseline", [1.0, -1.0], masks, log_probs=lp,
                                            ref_log_probs=ref, kl_coef=0.5)
    # whitening: mean 0.7/3 = 0.2333333; deviations [0.6666667, 0.5666667, -1.2333333]; squares sum 2.2866667,
    # unbiased var 1.1433333, std 1.0692676 -> [0.6234795, 0.5299576, -1.1534371]
    close(torch.cat(adv), [0.6234795, 0.5299576, -1.1534371], tol=1e-5)


def test_gae_hand_computed():
    # token rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma 1, lambda 0.5
    # deltas: d2 = 1 - 0.7 = 0.3; d1 = 0.7 - 0.6 = 0.1; d0 = 0.6 - 0.5 = 0.1
    # A2 = 0.3; A1 = 0.1 + 0.5 * 0.3 = 0.25; A0 = 0.1 + 0.5 * 0.25 = 0.225; returns = A + V
    rewards = ppo_token_rewards(torch.tensor([1.0]), [torch.zeros(3)], kl_coef=0.1)
    close(rewards[0], [0.0, 0.0, 1.0])
    adv, ret = gae(rewards, [torch.tensor([0.5, 0.6, 0.7])], gamma=1.0, lambd=0.5)
    close(adv[0], [0.225, 0.25, 0.3])
    close(ret[0], [0.725, 0.85, 1.0])


def test_ppo_estimator_with_kl_penalty_and_discount():
    # kl (k1) = [1, 1], kl_coef 0.1 -> token rewards [-0.1, -0.1 + 2] = [-0.1, 1.9]; values 0; gamma 0.5, lambd 1
    # A1 = 1.9; A0 = -0.1 + 0.5 * 1.9 = 0.85
    adv, ret = compute_advantages_and_returns("ppo", [2.0], [torch.ones(2)], log_probs=[torch.zeros(2)],
                                              ref_log_probs=[-torch.ones(2)], values=[torch.zeros(2)],
                                              kl_coef=0.1, gamma=0.5, lambd=1.0)
    close(adv[0], [0.85, 1.9])
    close(ret[0], [0.85, 1.9])
    with pytest.raises(ValueError, match="critic"):
        compute_advantages_and_returns("ppo", [1.0], [torch.ones(1)])


def test_discounted_returns():
    close(discounted_returns(torch.tensor([1.0, 2.0, 3.0]), 0.5), [1 + 0.5 * (2 + 0.5 * 3), 2 + 1.5, 3.0])
    assert discounted_returns(torch.zeros(0), 0.9).numel() == 0


def test_masked_whiten_with_cross_rank_reduce():
    a = [torch.tensor([1.0, 2.0, 100.0])]
    ma = [torch.tensor([1.0, 1.0, 0.0])]
    b = [torch.tensor([3.0, 4.0])]
    mb = [torch.tensor([1.0, 1.0])]
    # global tokens 1, 2, 3, 4: mean 2.5, unbiased var 5/3
    std = math.sqrt(5.0 / 3.0 + 1e-8)
    stats_b = torch.tensor([7.0, 25.0, 2.0], dtype=torch.float64)  # sum, sum of squares, count of "rank 1"
    out = masked_whiten(a, ma, reduce=lambda t: t + stats_b)
    close(out[0][:2], [(1 - 2.5) / std, (2 - 2.5) / std])
    # without the reduce only the local tokens count: mean 1.5, unbiased var 0.5
    close(masked_whiten(a, ma)[0][:2], [-0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5)], tol=1e-5)
    # nothing unmasked anywhere: unchanged, no NaN
    close(masked_whiten(b, [torch.zeros(2)])[0], [3.0, 4.0])


# -- KL -----------------------------------------------------------------------------------------------------
def test_kl_estimators_hand_computed():
    lp = torch.tensor([0.5, -1.0])
    base = torch.zeros(2)            # log_ratio x = [0.5, -1]
    close(compute_approx_kl(lp, base, "k1"), [0.5, -1.0])
    close(compute_approx_kl(lp, base, "k2"), [0.125, 0.5])
    # k3 = exp(-x) - 1 + x: exp(-0.5) - 0.5 = 0.10653066; e - 2 = 0.71828183
    close(compute_approx_kl(lp, base, "k3"), [0.10653066, 0.71828183])
    close(compute_approx_kl(lp, base, "low_var_kl"), [0.10653066, 0.71828183])
    # low_var_kl clamps to 10 (k3 does not): x = -20 -> exp(20) - 21
    x = torch.tensor([-20.0])
    close(compute_approx_kl(x, torch.zeros(1), "low_var_kl"), [10.0])
    assert compute_approx_kl(x, torch.zeros(1), "k3").item() > 4e8
    close(compute_approx_kl(lp, base, "k1", importance_ratio=torch.tensor([2.0, 0.5])), [1.0, -0.5])
    with pytest.raises(ValueError, match="k4"):
        compute_approx_kl(lp, base, "k4")


# -- policy loss --------------------------------------------------------------------------------------------
def _ratio_kl(ratios):
    return -torch.log(torch.tensor(ratios))


def test_policy_loss_asymmetric_clip():
    # eps_clip 0.2 (low), eps_clip_high 0.3
    ratios = [1.5, 1.25, 0.5, 0.5]
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0])
    loss, clipfrac = compute_policy_loss(_ratio_kl(ratios), adv, 0.2, 0.3)
    # 1.5, A=1: max(-1.5, -1.3) = -1.3 (clipped); 1.25, A=1: inside 1.3 -> -1.25;
    # 0.5, A=1: max(-0.5, -0.8) = -0.5 (unclipped); 0.5, A=-1: max(0.5, 0.8) = 0.8 (clipped)
    close(loss, [-1.3, -1.25, -0.5, 0.8])
    close(clipfrac, [1.0, 0.0, 0.0, 1.0])
    # symmetric 0.2 clips the 1.25 too
    loss_sym, cf_sym = compute_policy_loss(_ratio_kl(ratios), adv, 0.2, 0.2)
    close(loss_sym, [-1.2, -1.2, -0.5, 0.8])
    close(cf_sym, [1.0, 1.0, 0.0, 1.0])


def test_policy_loss_dual_clip_on_negative_advantages():
    ratios = [3.0, 3.0, 1.1]
    adv = torch.tensor([-1.0, 1.0, -2.0])
    loss, _ = compute_policy_loss(_ratio_kl(ratios), adv, 0.2, 0.2)
    close(loss, [3.0, -1.2, 2.2])
    # dual clip c = 2: for A < 0 the loss is capped at -c * A = 2 (ratio 3); A > 0 unaffected;
    # ratio 1.1, A=-2: loss 2.2 < 4 stays
    loss_c, _ = compute_policy_loss(_ratio_kl(ratios), adv, 0.2, 0.2, eps_clip_c=2.0)
    close(loss_c, [2.0, -1.2, 2.2])
    with pytest.raises(ValueError):
        compute_policy_loss(_ratio_kl(ratios), adv, 0.2, 0.2, eps_clip_c=0.9)


def test_policy_loss_gradient_is_zero_when_clipped():
    lp = torch.log(torch.tensor([1.5, 1.0])).requires_grad_()
    loss, _ = compute_policy_loss(torch.zeros(2) - lp, torch.tensor([1.0, 1.0]), 0.2, 0.2)
    loss.sum().backward()
    close(lp.grad, [0.0, -1.0])   # clipped token: no gradient; ratio 1: d(-r)/dlp = -1


def test_gspo_sequence_ratio():
    lp = [torch.tensor([-1.0, -2.0]), torch.tensor([-1.0])]
    old = [torch.tensor([-1.5, -2.5]), torch.tensor([-0.5])]
    kl = gspo_ppo_kl(lp, old, [torch.ones(2), torch.ones(1)])
    close(kl[0], [-0.5, -0.5])
    close(kl[1], [0.5])
    # a masked token does not enter the sequence mean: old - new = [-0.5, +1.0], mask [1, 0] -> -0.5
    kl = gspo_ppo_kl([torch.tensor([-1.0, -2.0])], [torch.tensor([-1.5, -1.0])], [torch.tensor([1.0, 0.0])])
    close(kl[0], [-0.5, -0.5])


def test_value_loss_clip():
    # v=1.0 old=0.5 R=2: v_clip = 0.7 -> max(1.69, 1.0) = 1.69, clipped; v=0.6 old=0.5 R=0 -> 0.36, not clipped
    loss, cf = compute_value_loss(torch.tensor([1.0, 0.6]), torch.tensor([0.5, 0.5]), torch.tensor([2.0, 0.0]), 0.2)
    close(loss, [1.69, 0.36])
    close(cf, [1.0, 0.0])
    loss, cf = compute_value_loss(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([2.0]), None)
    close(loss, [1.0])


def test_masked_reductions():
    values = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0])]
    masks = [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.0, 0.0])]
    # per sample: mean(1, 3) = 2 and a fully masked sample counts 0; over 2 samples -> 1.0
    close(reduce_loss(values, masks, per_token=False), 1.0)
    close(reduce_loss(torch.cat(values), masks, per_token=False), 1.0)
    close(reduce_loss(values, masks, per_token=False, denominator=4), 0.5)
    # per token: (1 + 3) / 2 unmasked tokens
    close(reduce_loss(values, masks, per_token=True), 2.0)
    close(reduce_loss(values, masks, per_token=True, denominator=8), 0.5)
    close(masked_mean(torch.tensor([1.0, 2.0]), torch.zeros(2)), 0.0)
    with pytest.raises(ValueError):
        reduce_loss(torch.zeros(4), masks, per_token=True)


# -- TIS ----------------------------------------------------------------------------------------------------
def test_tis_weights_clip_both_sides():
    old = torch.zeros(3)
    rollout = torch.tensor([-math.log(3.0), 0.0, math.log(4.0)])   # ratios exp(old - rollout) = 3, 1, 0.25
    w, m = tis_weights(old, rollout, tis_clip=2.0, tis_clip_low=0.5)
    close(w, [2.0, 1.0, 0.5])
    close(m["tis"], [3.0, 1.0, 0.25])
    close(m["tis_clipfrac"], [1.0, 0.0, 1.0])
    close(m["tis_abs"], [2.0, 0.0, 0.75])
    w, _ = tis_weights(old, rollout, tis_clip=2.0, tis_clip_low=0.0)
    close(w, [2.0, 1.0, 0.25])
    assert not w.requires_grad
    with pytest.raises(ValueError):
        tis_weights(old, rollout[:2])


# -- log-probs ----------------------------------------------------------------------------------------------
def test_log_probs_and_entropy_at_temperature():
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])   # softmax [0.25, 0.75]
    close(log_probs_from_logits(logits, torch.tensor([1, 0])), [math.log(0.75), math.log(0.25)])
    # temperature 2: logits / 2 -> p = [1, sqrt 3] / (1 + sqrt 3)
    p1 = math.sqrt(3) / (1 + math.sqrt(3))
    close(log_probs_from_logits(logits, torch.tensor([1, 0]), 2.0), [math.log(p1), math.log(1 - p1)])
    # greedy (0) and None mean temperature 1
    assert effective_temperature(0) == 1.0 and effective_temperature(None) == 1.0
    assert effective_temperature(1e-7) == 1.0 and effective_temperature(0.5) == 0.5
    close(log_probs_from_logits(logits, torch.tensor([1, 0]), 0.0), [math.log(0.75), math.log(0.25)])
    close(entropy_from_logits(logits[:1]), [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))])
    # low-precision logits are upcast before the softmax
    out = log_probs_from_logits(logits.to(torch.bfloat16), torch.tensor([1, 0]))
    assert out.dtype == torch.float32
    with pytest.raises(ValueError):
        log_probs_from_logits(logits, torch.tensor([1]))


def test_entropy_without_grad_is_the_entropy_a_chunk_of_rows_at_a_time(monkeypatch):
    """The entropy metric of a training micro-batch: each row's entropy as entropy_from_logits gives it, computed a
    chunk of rows at a time (its vocabulary-wide temporaries never span more than chunk_bytes), with no graph."""
    import slime_actors.algo.logprobs as lp_mod
    logits = torch.randn(2, 7, 10, generator=torch.Generator().manual_seed(0), requires_grad=True)
    want = entropy_from_logits(logits.detach(), 0.7)
    seen = []
    real = lp_mod.entropy_from_logits
    monkeypatch.setattr(lp_mod, "entropy_from_logits", lambda x, t: seen.append(tuple(x.shape)) or real(x, t))
    got = lp_mod.entropy_without_grad(logits, 0.7, chunk_bytes=3 * 4 * 10)   # three rows of 10 fp32 values
    assert seen == [(3, 10)] * 4 + [(2, 10)]                                  # 14 rows: 3+3+3+3+2
    assert got.shape == (2, 7) and not got.requires_grad
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert lp_mod.entropy_without_grad(logits, 0.7).shape == (2, 7)          # the default chunk: one here


# -- batching -----------------------------------------------------------------------------------------------
def test_dynamic_micro_batches_first_fit_decreasing():
    # FFD on [5, 3, 8, 2, 9] with budget 10: 9 | 8 | 5 ; 3 -> with 5 ; 2 -> with 8
    assert dynamic_micro_batches([5, 3, 8, 2, 9], 10) == [[0, 1], [2, 3], [4]]
    # an over-long sample gets its own micro-batch
    assert dynamic_micro_batches([12, 3, 4], 10) == [[0], [1, 2]]
    for mb in dynamic_micro_batches([5, 3, 8, 2, 9, 1, 1, 7], 10):
        assert sum([5, 3, 8, 2, 9, 1, 1, 7][i] for i in mb) <= 10


def test_fixed_and_mini_batches():
    assert fixed_micro_batches(5, 2) == [[0, 1], [2, 3], [4]]
    assert mini_batch_indices(5, 2) == [[0, 1, 2], [3, 4]]
    assert mini_batch_indices(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mini_batch_indices(1, 2) == [[0], []]
    assert micro_batch_indices([3, 3], micro_batch_size=1, min_count=4) == [[0], [1], [], []]
    assert micro_batch_indices([3, 9, 3], dynamic=True, max_tokens=6) == [[0, 2], [1]]


def test_pad_tokens_right_padding():
    ids, mask, pos = pad_tokens([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert pos.tolist() == [[0, 1, 2], [0, 1, 2]]


def _batch():
    return {"tokens": [[1, 2, 3], [1, 4, 5, 6]], "prompt_lengths": [2, 2], "response_lengths": [1, 2],
            "loss_masks": [[1], [1, 0]], "rollout_log_probs": [[-0.1], [-0.2, -0.3]], "rewards": [1.0, 0.0],
            "sample_index": [10, 11], "group_index": [0, 0], "weight_versions": [0, 0]}


def test_select_and_validate():
    b = _batch()
    s = select(b, [1])
    assert s["tokens"] == [[1, 4, 5, 6]] and s["sample_index"] == [11]
    validate_batch(b)
    bad = _batch()
    bad["response_lengths"][1] = 3
    with pytest.raises(ValueError, match=r"sample 1 \(sample_index=11\)"):
        validate_batch(bad)
    bad = _batch()
    bad["loss_masks"][0] = [1, 1]
    with pytest.raises(ValueError, match=r"sample 0 \(sample_index=10\).*loss_mask"):
        validate_batch(bad)
    bad = _batch()
    bad["rollout_log_probs"][1] = [-0.2]
    with pytest.raises(ValueError, match=r"sample 1 .*rollout_log_probs"):
        validate_batch(bad)
    bad = _batch()
    bad["rollout_log_probs"][1] = []
    validate_batch(bad)  # missing rollout log-probs are allowed ...
    with pytest.raises(ValueError, match=r"sample 1 .*rollout_log_probs"):
        validate_batch(bad, require_rollout_log_probs=True)  # ... unless TIS needs them


def test_micro_batches_partition_and_respect_budget_property():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.integers(1, 40), max_size=30), st.integers(1, 50), st.integers(1, 6))
    def check(lengths, budget, steps):
        mbs = dynamic_micro_batches(lengths, budget)
        assert sorted(i for mb in mbs for i in mb) == list(range(len(lengths)))
        for mb in mbs:
            assert mb and (sum(lengths[i] for i in mb) <= budget or len(mb) == 1)
        chunks = mini_batch_indices(len(lengths), steps)
        assert len(chunks) == steps and [i for c in chunks for i in c] == list(range(len(lengths)))
        assert max(map(len, chunks)) - min(map(len, chunks)) <= 1

    check()
