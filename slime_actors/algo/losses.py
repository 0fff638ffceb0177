"""Policy and value losses (PPO family) and the masked reductions that turn per-token losses into a scalar.

Conventions (slime's): ``ppo_kl = old_log_probs - log_probs`` per token, so the importance ratio is
``exp(-ppo_kl)``. Per-token losses are reduced over the tokens whose loss mask is 1, either

* per sample then over samples (default): ``sum_i mean_{t in i} x_t`` divided by the number of samples, or
* per token (--calculate-per-token-loss): ``sum_i sum_{t in i} x_t`` divided by the number of tokens,

where the divisor may be a global count (all micro-batches and ranks of an optimizer step), so that micro-batch
and rank contributions simply add up.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


# -- ratios -------------------------------------------------------------------------------------------------
def gspo_ppo_kl(log_probs: Sequence[torch.Tensor], old_log_probs: Sequence[torch.Tensor],
                loss_masks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """GSPO's sequence-level ``ppo_kl``: per sample the masked mean of ``old - new`` over its response,
    broadcast to each of its tokens (so the ratio is the geometric mean of the token ratios)."""
    out = []
    for lp, old, m in zip(log_probs, old_log_probs, loss_masks, strict=True):
        m = m.to(lp.dtype)
        seq = ((old - lp) * m).sum() / m.sum().clamp_min(1)
        out.append(seq.expand_as(lp))
    return out


# -- policy loss --------------------------------------------------------------------------------------------
def compute_policy_loss(ppo_kl: torch.Tensor, advantages: torch.Tensor, eps_clip: float,
                        eps_clip_high: float | None = None, eps_clip_c: float | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token. Returns ``(pg_losses, clipfrac)``, both per token.

    ratio = exp(-ppo_kl);  loss = max(-ratio * A, -clip(ratio, 1 - eps_clip, 1 + eps_clip_high) * A);
    dual clip (eps_clip_c > 1): for A < 0 the loss is further capped at ``-eps_clip_c * A``.
    ``clipfrac`` is 1 where the clipped term is the larger (the clip is active).
    """
    if eps_clip_high is None:
        eps_clip_high = eps_clip
    ratio = torch.exp(-ppo_kl)
    loss1 = -ratio * advantages
    loss2 = -ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    clipped = torch.maximum(loss1, loss2)
    clipfrac = torch.gt(loss2, loss1).float()
    if eps_clip_c is not None:
        if eps_clip_c <= 1.0:
            raise ValueError(f"eps_clip_c (dual clip) must be > 1.0, got {eps_clip_c}")
        loss3 = -eps_clip_c * advantages
        clipped = torch.where(advantages < 0, torch.minimum(loss3, clipped), clipped)
    return clipped, clipfrac


def compute_cispo_loss(ppo_kl: torch.Tensor, log_probs: torch.Tensor, advantages: torch.Tensor, eps_clip: float,
                       eps_clip_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4-5) per token: ``-sg(clip(ratio, 1 - eps_clip, 1 + eps_clip_high))
    * A * log_prob``. The importance ratio is truncated under stop-gradient and the gradient flows through the
    log-prob, so a truncated token still contributes gradient (PPO's clip drops it). ``clipfrac`` is 1 where the
    ratio was truncated. Canonical CISPO has no lower bound: eps_clip >= 1."""
    if eps_clip_high is None:
        eps_clip_high = eps_clip
    ratio = torch.exp(-ppo_kl)
    truncated = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    losses = -truncated.detach() * advantages * log_probs
    return losses, (truncated != ratio).float()


def sft_loss(log_probs: torch.Tensor) -> torch.Tensor:
    """--loss-type sft_loss per token: the negative log-likelihood of the response tokens."""
    return -log_probs


# -- value loss ---------------------------------------------------------------------------------------------
def compute_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       value_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss per token: ``max((v_clip - R)^2, (v - R)^2)`` with
    ``v_clip = v_old + clamp(v - v_old, -value_clip, value_clip)``. Returns ``(losses, clipfrac)``;
    value_clip None disables clipping."""
    if value_clip is None:
        return (values - returns).pow(2), torch.zeros_like(values)
    clipfrac = ((values - old_values).abs() > value_clip).float()
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    return torch.maximum((clipped - returns).pow(2), (values - returns).pow(2)), clipfrac


# -- reductions ---------------------------------------------------------------------------------------------
def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 where the mask is empty, never NaN)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp_min(1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1)


def sum_of_sample_mean(values: Sequence[torch.Tensor], loss_masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sum_i masked_mean(values_i, mask_i)`` (a fully masked sample contributes 0)."""
    total = None
    for x, m in zip(values, loss_masks, strict=True):
        term = masked_mean(x, m)
        total = term if total is None else total + term
    return total if total is not None else torch.zeros(())


def sum_of_tokens(values: Sequence[torch.Tensor], loss_masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sum_i sum_t values_i[t] * mask_i[t]``."""
    total = None
    for x, m in zip(values, loss_masks, strict=True):
        term = (x * m.to(x.dtype)).sum()
        total = term if total is None else total + term
    return total if total is not None else torch.zeros(())


def reduce_loss(values: torch.Tensor | Sequence[torch.Tensor], loss_masks: Sequence[torch.Tensor],
                per_token: bool, denominator: float | torch.Tensor | None = None) -> torch.Tensor:
    """Reduce per-token values (one tensor per sample, or their concatenation) to a scalar.

    per_token False: sum of per-sample masked means / denominator (default: the number of samples);
    per_token True: masked token sum / denominator (default: the number of unmasked tokens, at least 1).
    """
    if isinstance(values, torch.Tensor):
        lengths = [int(m.numel()) for m in loss_masks]
        if values.numel() != sum(lengths):
            raise ValueError(f"{values.numel()} values for {sum(lengths)} tokens")
        values = list(values.split(lengths))
    if per_token:
        num = sum_of_tokens(values, loss_masks)
        if denominator is None:
            denominator = max(sum(float(m.sum()) for m in loss_masks), 1.0)
    else:
        num = sum_of_sample_mean(values, loss_masks)
        if denominator is None:
            denominator = max(len(values), 1)
    return num / denominator
