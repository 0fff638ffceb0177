"""Dynamic sampling filters: keep or drop a whole prompt group once its samples are scored.

    --dynamic-sampling-filter-path slime_actors.filters.check_reward_nonzero_std

A filter is `fn(args, samples) -> bool` (keep the group) named by a dotted path or "file.py:fn"; `args` is slime's
flat view of the job's flags (slime_actors.config.FlatArgs). It may also return a `FilterOutput` (slime's
DynamicFilterOutput shape: keep, reason, keep_when_insufficient), which is truthy when the group is kept.
`DynamicFilter` loads one, applies it, and counts what it dropped and why.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from slime_actors.plugins import maybe_load_function

__all__ = ["FilterOutput", "check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback", "call_filter",
           "DynamicFilter"]


@dataclass
class FilterOutput:
    keep: bool
    reason: str | None = None
    # keep a dropped group anyway when dropping it would leave too few groups to fill the batch
    keep_when_insufficient: bool = False

    def __bool__(self) -> bool:
        return bool(self.keep)


def _rewards(args, samples) -> list[float]:
    out = []
    key = args.reward_key
    for s in samples:
        r = s.reward
        if isinstance(r, dict):
            r = r.get(key or "reward")
        if r is None:
            raise ValueError(f"sample {s.index} (group {s.group_index}) has no reward: filter scored groups only")
        out.append(float(r))
    return out


def check_reward_nonzero_std(args, samples, **kwargs) -> FilterOutput:
    """Drop groups whose rewards all agree (standard deviation <= 1e-6): they carry no GRPO signal."""
    rewards = _rewards(args, samples)
    if not rewards:
        return FilterOutput(False, "empty_group")
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    keep = std > 1e-6
    return FilterOutput(keep, None if keep else f"zero_std_{round(rewards[0], 1)}")


def check_reward_nonzero_std_with_fallback(args, samples, **kwargs) -> FilterOutput:
    """Like check_reward_nonzero_std, but a dropped group is used when there are too few others."""
    out = check_reward_nonzero_std(args, samples, **kwargs)
    out.keep_when_insufficient = True
    return out


def call_filter(fn, args, samples) -> FilterOutput:
    """Apply a filter (None keeps everything) and normalise its answer to a FilterOutput."""
    if fn is None:
        return FilterOutput(True)
    out = fn(args, samples)
    if isinstance(out, FilterOutput):
        return out
    if hasattr(out, "keep"):  # slime's DynamicFilterOutput or a look-alike
        return FilterOutput(bool(out.keep), getattr(out, "reason", None),
                            bool(getattr(out, "keep_when_insufficient", False)))
    if out is None:
        raise TypeError(f"dynamic sampling filter {getattr(fn, '__name__', fn)!r} returned None, expected bool")
    keep = bool(out)  # bool, numpy bool, 0-d tensor
    return FilterOutput(keep, None if keep else "filtered")


class DynamicFilter:
    """--dynamic-sampling-filter-path, loaded once; `dropped` counts drops by reason."""

    def __init__(self, path: str | None):
        self.path = path
        self.fn = maybe_load_function(path, flag="--dynamic-sampling-filter-path")
        self.kept = 0
        self.dropped: Counter = Counter()

    def __call__(self, args, samples) -> FilterOutput:
        out = call_filter(self.fn, args, samples)
        if out.keep:
            self.kept += 1
        else:
            self.dropped[out.reason or "filtered"] += 1
        return out

    def metrics(self) -> dict[str, int]:
        return {"rollout/dynamic_filter/kept": self.kept,
                **{f"rollout/dynamic_filter/drop_{r}": c for r, c in self.dropped.items()}}
