"""KL estimators between the policy and a base (reference) policy, per token (Schulman, "Approximating KL
Divergence", http://joschu.net/blog/kl-approx.html), with slime's conventions:

    log_ratio = log_probs - log_probs_base           (log pi / pi_base, tokens sampled from pi)
    k1          = log_ratio
    k2          = log_ratio ** 2 / 2
    k3          = exp(-log_ratio) - 1 + log_ratio     (non-negative, unbiased)
    low_var_kl  = k3 clamped to [-10, 10]

An optional ``importance_ratio`` (pi_theta / pi_old) multiplies the estimate before the clamp.
"""

from __future__ import annotations

import torch

KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
LOW_VAR_KL_CLAMP = 10.0


def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_type: str = "k1",
                      importance_ratio: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token KL estimate of KL(pi || pi_base) (same shape as the inputs, fp32)."""
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_type == "k1":
        kl = log_ratio
    elif kl_type == "k2":
        kl = log_ratio.pow(2) / 2.0
    elif kl_type in ("k3", "low_var_kl"):
        neg = -log_ratio
        kl = neg.exp() - 1 - neg
    else:
        raise ValueError(f"unknown KL type {kl_type!r}; expected one of {KL_TYPES}")
    if importance_ratio is not None:
        kl = importance_ratio * kl
    if kl_type == "low_var_kl":
        kl = kl.clamp(min=-LOW_VAR_KL_CLAMP, max=LOW_VAR_KL_CLAMP)
    return kl
