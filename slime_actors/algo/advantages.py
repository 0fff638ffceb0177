"""Rewards post-processing and per-token advantages / returns for each --advantage-estimator.

Two stages, as in slime:

1. ``normalize_group_rewards`` (per prompt group, on scalar rewards):
   grpo / gspo / cispo: ``(r - mean_g) / (std_g + eps)`` (std unbiased; dropped with --disable-grpo-std-normalization);
   reinforce_plus_plus_baseline: ``r - mean_g``; reinforce_plus_plus / ppo: unchanged.
2. ``compute_advantages_and_returns`` (per token, one 1-D tensor per sample over its response):
   grpo / gspo / cispo: the normalized reward broadcast over the response (returns = advantages; as in slime, --kl-coef
   does not enter: use --use-kl-loss);
   reinforce_plus_plus: token rewards ``-kl_coef * kl_t`` (masked) plus the reward at the last unmasked token,
   discounted returns with --gamma, then whitened;
   reinforce_plus_plus_baseline: ``r - mean_g - kl_coef * kl_t`` broadcast, then whitened;
   ppo: token rewards ``-kl_coef * kl_t`` plus the reward at the last token, GAE with --gamma / --lambd from the
   critic's values; returns = advantages + values.
   --normalize-advantages whitens the advantages of any estimator (the reinforce_plus_plus ones always are).

Whitening uses statistics over all unmasked tokens; pass ``reduce`` (a function that sums a 1-D tensor across
the data-parallel ranks, e.g. an all-reduce) to whiten with the statistics of every rank's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .kl import compute_approx_kl

Reduce = Callable[[torch.Tensor], torch.Tensor]  # sums a tensor across ranks; returns the reduced tensor

GROUP_NORM_ESTIMATORS = ("grpo", "gspo", "cispo")
BASELINE_ESTIMATORS = ("reinforce_plus_plus_baseline",)
ALWAYS_WHITEN = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")


# -- stage 1: scalar rewards --------------------------------------------------------------------------------
def normalize_group_rewards(rewards: Sequence[float] | torch.Tensor, group_index: Sequence[int] | None,
                            estimator: str, std_normalization: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Rewards after per-group post-processing (fp32, same order). ``group_index`` names each sample's prompt
    group (samples of a group need not be adjacent); None means one group. A group of identical rewards gives
    exactly zeros (0.7 x 8 too, whose fp32 mean is a few ulps off 0.7: a group without spread is set to 0 rather
    than its rounding error divided by eps); a group of one sample has std 0."""
    r = torch.as_tensor(rewards, dtype=torch.float32).flatten().clone()
    if estimator not in GROUP_NORM_ESTIMATORS + BASELINE_ESTIMATORS:
        return r
    if group_index is None:
        group_index = [0] * r.numel()
    if len(group_index) != r.numel():
        raise ValueError(f"{r.numel()} rewards but {len(group_index)} group indices")
    gi = torch.as_tensor(list(group_index), dtype=torch.long)
    out = torch.empty_like(r)
    for g in torch.unique(gi).tolist():
        sel = gi == g
        x = r[sel]
        if bool((x == x[0]).all()):
            out[sel] = 0.0
            continue
        x = x - x.mean()
        if estimator in GROUP_NORM_ESTIMATORS and std_normalization:
            x = x / (x.std() + eps)
        out[sel] = x
    return out


# -- stage 2: per token -------------------------------------------------------------------------------------
def per_token_kl(log_probs: Sequence[torch.Tensor] | None, ref_log_probs: Sequence[torch.Tensor] | None,
                 response_lengths: Sequence[int], kl_coef: float, kl_type: str = "k1") -> list[torch.Tensor]:
    """KL(actor || ref) per token for the reward penalty; zeros when kl_coef is 0 or log-probs are missing."""
    if kl_coef == 0 or not log_probs or ref_log_probs is None:
        return [torch.zeros(int(n), dtype=torch.float32) for n in response_lengths]
    return [compute_approx_kl(lp, ref, kl_type) for lp, ref in zip(log_probs, ref_log_probs, strict=True)]


def grpo_returns(rewards: torch.Tensor, response_lengths: Sequence[int]) -> list[torch.Tensor]:
    """Each sample's (normalized) reward broadcast over its response tokens."""
    return [torch.full((int(n),), float(r), dtype=torch.float32) for r, n in zip(rewards.tolist(),
                                                                                   response_lengths, strict=True)]


def discounted_returns(token_rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` along the last dimension."""
    out = torch.zeros_like(token_rewards)
    if not token_rewards.shape[-1]:
        return out
    running = torch.zeros_like(token_rewards[..., 0])
    for t in range(token_rewards.shape[-1] - 1, -1, -1):
        running = token_rewards[..., t] + gamma * running
        out[..., t] = running
    return out


def reinforce_plus_plus_returns(rewards: torch.Tensor, kl: Sequence[torch.Tensor],
                                loss_masks: Sequence[torch.Tensor], kl_coef: float, gamma: float
                                ) -> list[torch.Tensor]:
    """REINFORCE++ (arXiv 2501.03262) discounted returns, before whitening. Token rewards are
    ``-kl_coef * kl_t * mask_t``, plus the sequence reward at the last unmasked token (the last token if the
    whole response is masked)."""
    out = []
    for r, k, m in zip(rewards.tolist(), kl, loss_masks, strict=True):
        m = m.float()
        if m.numel() == 0:
            out.append(torch.zeros(0))
            continue
        tr = -kl_coef * k.float() * m
        nz = m.nonzero()
        last = int(nz[-1]) if nz.numel() else m.numel() - 1
        tr[last] += r
        out.append(discounted_returns(tr, gamma))
    return out


def reinforce_plus_plus_baseline_advantages(rewards: torch.Tensor, kl: Sequence[torch.Tensor], kl_coef: float
                                            ) -> list[torch.Tensor]:
    """``(r - group baseline) - kl_coef * kl_t`` per token, before whitening (rewards already baselined)."""
    return [torch.full_like(k.float(), float(r)) - kl_coef * k.float()
            for r, k in zip(rewards.tolist(), kl, strict=True)]


def gae(token_rewards: Sequence[torch.Tensor], values: Sequence[torch.Tensor], gamma: float, lambd: float
        ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Generalized advantage estimation per sample (value after the last token = 0):
    ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t = delta_t + gamma * lambd * A_{t+1}``, ``R_t = A_t + V_t``."""
    advs, rets = [], []
    for r, v in zip(token_rewards, values, strict=True):
        r, v = r.float(), v.float().detach()
        if r.shape != v.shape:
            raise ValueError(f"rewards {tuple(r.shape)} and values {tuple(v.shape)} differ in shape")
        nxt = torch.cat([v[1:], v.new_zeros(1)]) if v.numel() else v
        delta = r + gamma * nxt - v
        a = discounted_returns(delta, gamma * lambd)
        advs.append(a)
        rets.append(a + v)
    return advs, rets


def ppo_token_rewards(rewards: torch.Tensor, kl: Sequence[torch.Tensor], kl_coef: float) -> list[torch.Tensor]:
    """PPO token rewards: ``-kl_coef * kl_t``, plus the sequence reward at the last response token."""
    out = []
    for r, k in zip(rewards.tolist(), kl, strict=True):
        tr = -kl_coef * k.float()
        if tr.numel():
            tr[-1] += r
        out.append(tr)
    return out


def masked_whiten(values: Sequence[torch.Tensor], loss_masks: Sequence[torch.Tensor],
                  reduce: Reduce | None = None, eps: float = 1e-8, shift_mean: bool = True
                  ) -> list[torch.Tensor]:
    """``(x - mean) / sqrt(var + eps)`` with mean and (Bessel-corrected) variance over the unmasked tokens of
    all samples -- of all ranks when ``reduce`` sums across them. Masked tokens are transformed too (their
    values do not matter). With no unmasked token anywhere the values are returned unchanged."""
    values = [v.float() for v in values]
    flat = torch.cat(values) if values else torch.zeros(0)
    mask = torch.cat([m.float() for m in loss_masks]) if loss_masks else torch.zeros(0)
    if flat.shape != mask.shape:
        raise ValueError(f"{flat.numel()} values but {mask.numel()} mask entries")
    f64, m64 = flat.double(), mask.double()   # exact sums of fp32 values: a constant stays its own mean
    stats = torch.stack([(f64 * m64).sum(), (f64.pow(2) * m64).sum(), m64.sum()])
    if reduce is not None:
        stats = reduce(stats)
    s, s2, n = (float(x) for x in stats)
    if n == 0:
        return values
    mean = s / n
    var = max(s2 / n - mean * mean, 0.0)
    if n >= 2:
        var *= n / (n - 1)
    # in float64: equal values (all zeros from constant groups, say) stay exactly equal to the mean
    out = (flat.double() - mean) * (var + eps) ** -0.5
    if not shift_mean:
        out = out + mean
    return list(out.float().split([v.numel() for v in values]))


def compute_advantages_and_returns(
    estimator: str,
    rewards: Sequence[float] | torch.Tensor,
    loss_masks: Sequence[torch.Tensor],
    *,
    log_probs: Sequence[torch.Tensor] | None = None,
    ref_log_probs: Sequence[torch.Tensor] | None = None,
    values: Sequence[torch.Tensor] | None = None,
    kl_coef: float = 0.0,
    kl_type: str = "k1",
    gamma: float = 1.0,
    lambd: float = 1.0,
    normalize_advantages: bool = False,
    reduce: Reduce | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-token ``(advantages, returns)`` (one fp32 tensor per sample over its response).

    ``rewards`` are the post-processed scalar rewards (``normalize_group_rewards``); ``log_probs`` /
    ``ref_log_probs`` feed the KL penalty (--kl-coef, estimator --kl-loss-type); ``values`` are the critic's
    (ppo only). ``reduce`` sums whitening statistics across ranks.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32).flatten()
    loss_masks = [torch.as_tensor(m, dtype=torch.float32) for m in loss_masks]
    lengths = [int(m.numel()) for m in loss_masks]
    if rewards.numel() != len(loss_masks):
        raise ValueError(f"{rewards.numel()} rewards for {len(loss_masks)} samples")
    kl = per_token_kl(log_probs, ref_log_probs, lengths, kl_coef, kl_type)
    if estimator in GROUP_NORM_ESTIMATORS:
        advantages = grpo_returns(rewards, lengths)
        returns = [a.clone() for a in advantages]
    elif estimator == "reinforce_plus_plus":
        returns = reinforce_plus_plus_returns(rewards, kl, loss_masks, kl_coef, gamma)
        advantages = [r.clone() for r in returns]
    elif estimator == "reinforce_plus_plus_baseline":
        advantages = reinforce_plus_plus_baseline_advantages(rewards, kl, kl_coef)
        returns = [a.clone() for a in advantages]
    elif estimator == "ppo":
        if values is None:
            raise ValueError("advantage estimator ppo needs the critic's values")
        advantages, returns = gae(ppo_token_rewards(rewards, kl, kl_coef), values, gamma, lambd)
    else:
        raise ValueError(f"unknown advantage estimator {estimator!r}")
    for i, (a, n) in enumerate(zip(advantages, lengths, strict=True)):
        if a.numel() != n:
            raise ValueError(f"sample {i}: {a.numel()} advantages for a response of {n} tokens")
    if normalize_advantages or estimator in ALWAYS_WHITEN:
        advantages = masked_whiten(advantages, loss_masks, reduce=reduce)
    return advantages, returns
