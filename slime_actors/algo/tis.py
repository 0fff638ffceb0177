"""Truncated importance sampling (TIS): correct for the mismatch between the engine that generated a rollout and
the trainer's recomputation of the same policy.

    w = clamp(exp(old_log_probs - rollout_log_probs), tis_clip_low, tis_clip)

``old_log_probs`` are the trainer's log-probs before the update (--use-tis, --tis-clip, --tis-clip-low). The
per-token policy loss is multiplied by ``w``; the weights carry no gradient.
"""

from __future__ import annotations

import torch


def tis_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, tis_clip: float = 2.0,
                tis_clip_low: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weights per token and per-token metric tensors (to be masked-averaged by the caller):
    ``tis`` (the raw ratio), ``tis_clipfrac`` (1 where the clamp changed it), ``tis_abs`` (|ratio - 1|)."""
    if old_log_probs.shape != rollout_log_probs.shape:
        raise ValueError(f"old log-probs {tuple(old_log_probs.shape)} and rollout log-probs "
                         f"{tuple(rollout_log_probs.shape)} differ in shape")
    if tis_clip_low > tis_clip:
        raise ValueError(f"--tis-clip-low ({tis_clip_low}) > --tis-clip ({tis_clip})")
    ratio = torch.exp(old_log_probs.detach().float() - rollout_log_probs.detach().float())
    w = ratio.clamp(min=tis_clip_low, max=tis_clip)
    metrics = {"tis": ratio, "tis_clipfrac": (w != ratio).float(), "tis_abs": (ratio - 1).abs()}
    return w, metrics
