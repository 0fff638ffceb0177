"""The trainer's GPU memory per part of its update (slime_actors/gpu_memory.py): the allocator's peak counters reset
before each part rl_update names, each part's peak reported under its name; on a machine without a GPU nothing is
measured and no metric is added. The allocator here is a stand-in (CI has no GPU): what is checked is which counters
are read when, and how they are named."""

from __future__ import annotations

import contextlib

import torch

from slime_actors.backends.rl_update import rl_update
from slime_actors.gpu_memory import GIB, PhasePeaks, both, cuda_stats
from tests.test_on_policy_forward import batch_with_rollout_log_probs
from tests.test_torch_backend import backend_for, make_args, tiny_dir  # noqa: F401

torch.set_num_threads(1)


class FakeAllocator:
    """Each reset starts a part; the part's peak is 1 GiB more than the last one's, its reserved twice that."""

    def __init__(self):
        self.resets = 0
        self.log: list[str] = []

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1
        self.log.append("reset")

    def max_memory_allocated(self) -> int:
        self.log.append("allocated")
        return int(self.resets * GIB)

    def max_memory_reserved(self) -> int:
        return int(2 * self.resets * GIB)

    def memory_reserved(self) -> int:
        return int(1.5 * GIB)


def test_each_part_of_an_update_gets_its_own_peak(tmp_path, tiny_dir):
    args = make_args(tmp_path, tiny_dir, rollout_batch_size=4, global_batch_size=8, micro_batch_size=4,
                     use_kl_loss=True, kl_loss_coef=0.1)       # a reference forward: both parts run
    b = backend_for(args)
    alloc = FakeAllocator()
    peaks = PhasePeaks(alloc)
    seen: list[str] = []

    @contextlib.contextmanager
    def profiler_phase(name):   # the profiler's phases still see every part (both() enters the two)
        seen.append(name)
        yield

    metrics = rl_update(b, args, batch_with_rollout_log_probs(b), 0, phase=both(profiler_phase, peaks.phase))
    assert seen == ["train_log_probs", "train_actor"]
    assert alloc.log == ["reset", "allocated", "reset", "allocated"]   # reset before each part, read after it
    got = peaks.metrics()
    assert got == {"memory/train_log_probs_peak_gib": 1.0, "memory/train_actor_peak_gib": 2.0,
                   "memory/peak_reserved_gib": 4.0, "memory/reserved_gib": 1.5}
    assert "pg_loss" in metrics   # (the update itself ran)


def test_a_part_that_fails_still_reads_its_peak():
    alloc = FakeAllocator()
    peaks = PhasePeaks(alloc)
    try:
        with peaks.phase("train_actor"):
            raise RuntimeError("CUDA out of memory")
    except RuntimeError:
        pass
    assert peaks.metrics()["memory/train_actor_peak_gib"] == 1.0


def test_without_a_gpu_nothing_is_measured():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return   # (a GPU machine: the CPU case is CI's)
    assert cuda_stats() is None
    peaks = PhasePeaks(cuda_stats())
    with peaks.phase("train_actor"):
        pass
    assert peaks.metrics() == {}
