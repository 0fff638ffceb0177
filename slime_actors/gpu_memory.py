"""The trainer's GPU memory per part of its update, as step metrics.

Each part of the RL update (``train_log_probs``: the reference and old-policy forwards; ``train_actor``: the
optimizer steps, forward and backward) is run with the CUDA allocator's peak counters reset before it, and its peak
is reported with the step's metrics:

    train/memory/train_log_probs_peak_gib   the most allocated while the log-prob forwards ran (GiB)
    train/memory/train_actor_peak_gib       the same for the training forwards, backwards and optimizer steps
    train/memory/peak_reserved_gib          the most the allocator held from the device in any part (its cache
                                            included: what nvidia-smi shows, less the CUDA context)
    train/memory/reserved_gib               what it holds at the end of the update

Allocated against reserved tells fragmentation (reserved far above allocated: try
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) from activations (allocated itself high: a smaller
--micro-batch-size or --use-dynamic-batch-size). Without a GPU nothing is measured and no metric is added.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Protocol

GIB = float(1 << 30)


class AllocatorStats(Protocol):
    """What is read from the allocator (``torch.cuda``'s functions of the same names)."""

    def reset_peak_memory_stats(self) -> None: ...
    def max_memory_allocated(self) -> int: ...
    def max_memory_reserved(self) -> int: ...
    def memory_reserved(self) -> int: ...


def cuda_stats() -> AllocatorStats | None:
    """``torch.cuda`` where this process computes on a GPU (CUDA initialised), else None."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda
    return None


class PhasePeaks:
    """Peaks per named part of one update; ``metrics()`` names them (see the module's doc)."""

    def __init__(self, stats: AllocatorStats | None):
        self.stats = stats
        self.peaks: dict[str, float] = {}
        self.peak_reserved = 0.0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        stats = self.stats
        if stats is None:
            yield
            return
        stats.reset_peak_memory_stats()
        try:
            yield
        finally:
            self.peaks[name] = max(self.peaks.get(name, 0.0), stats.max_memory_allocated() / GIB)
            self.peak_reserved = max(self.peak_reserved, stats.max_memory_reserved() / GIB)

    def metrics(self) -> dict[str, float]:
        if self.stats is None:
            return {}
        out = {f"memory/{name}_peak_gib": v for name, v in self.peaks.items()}
        out["memory/peak_reserved_gib"] = self.peak_reserved
        out["memory/reserved_gib"] = self.stats.memory_reserved() / GIB
        return out


def both(first: Callable[[str], Any], second: Callable[[str], Any]) -> Callable[[str], Any]:
    """One phase callback that enters ``first(name)`` then ``second(name)`` (what rl_update's ``phase`` takes)."""
    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        with first(name), second(name):
            yield
    return phase
