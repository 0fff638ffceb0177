"""Python's garbage collector in the job's processes: long collections logged, and what start-up built frozen.

A full (generation 2) collection walks every object the process tracks -- in a trainer or a buffer, the hundreds of
thousands that torch, transformers, the dataset and the tokenizer leave after start-up -- and stops the process's
event loop meanwhile: 100-250 ms in the digits job's trainer and buffer on CPU (bench/gc_pauses.py); on one H200 the
buffer stopped for 225-265 ms once a run, right after a rollout completed, with the trainer waiting for its batch
(the shape of such a collection; that run did not log them). Two remedies, as SGLang has them (its
--gc-warning-threshold-secs and /freeze_gc):

* `watch(log)` (every actor process, at its start): a collection that takes SLIME_ACTORS_GC_WARN_MS or longer (50 by
  default; 0: off) is logged as "long garbage collection" with its generation and milliseconds: a warning once the
  process has started (`settle` ran), into the JSON log only before (start-up's collections are expected).
* `settle(log)` (once an actor process has started): one collection of what start-up left for the collector, then
  `gc.freeze()` -- the objects alive now move to the permanent generation, which later collections do not walk.
  They are still freed by reference counting; only a reference cycle among them that becomes unreachable later is
  never collected (start-up's own cycles were collected just before). SLIME_ACTORS_GC_FREEZE=0 leaves it out.
* Start-up itself, from `watch` to `settle`: importing torch and transformers and loading a model make objects
  faster than the collector's thresholds expect, so full collections come again and again, each walking everything
  made so far (7 of them, 840 ms, in the digits job's trainer on a 2-vCPU VM, before its first step; 8, 1.6 s, in a
  rollout worker on a GPU host). So each full collection during start-up freezes its survivors (what it found alive
  is start-up's), and the next walks only what came after; `settle` unfreezes them for its one collection of
  everything, then freezes. Also left out by SLIME_ACTORS_GC_FREEZE=0.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

from .env import GC_FREEZE, GC_WARN_MS

Callback = Callable[[str, dict[str, Any]], None]
_settled = False   # this process has started (settle ran): a long collection is news
_frozen_at_start_up = [False]   # a full collection during start-up froze its survivors (settle unfreezes them)


def watch(log: Any, warn_ms: float | None = None, freeze: bool | None = None) -> Callback | None:
    """Log every collection of `warn_ms` milliseconds or more (default SLIME_ACTORS_GC_WARN_MS), and until `settle`
    freeze the survivors of each full collection (`freeze`, default SLIME_ACTORS_GC_FREEZE; the module's docstring
    says why). Returns the callback installed in gc.callbacks (`unwatch` removes it), or None when it has nothing to
    do (the threshold 0 and freezing off)."""
    threshold = GC_WARN_MS.get() if warn_ms is None else warn_ms
    logging = threshold is not None and threshold > 0
    freezing = GC_FREEZE.get() if freeze is None else freeze
    if not logging and not freezing:
        return None
    started: list[float] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
            return
        if freezing and not _settled and info.get("generation") == 2:
            _frozen_at_start_up[0] = True
            gc.freeze()   # (after the collection: what it left alive moves to the permanent generation)
        if not started:   # (installed while a collection ran)
            return
        ms = (time.perf_counter() - started.pop()) * 1000.0
        if logging and ms >= threshold:   # (start-up's are expected: in the JSON log only, until `settle`)
            fields = {"generation": info.get("generation"), "ms": round(ms, 1), "collected": info.get("collected"),
                      "frozen": gc.get_freeze_count(), "threshold_ms": threshold}
            if _settled:
                log.warning("long garbage collection", **fields)
            else:
                log.info("long garbage collection", **fields, during="start-up", console=False)
    gc.callbacks.append(callback)
    return callback


def unwatch(callback: Callback | None) -> None:
    if callback is not None and callback in gc.callbacks:
        gc.callbacks.remove(callback)


def settle(log: Any, freeze: bool | None = None) -> dict[str, Any] | None:
    """Collect what start-up left, then freeze the survivors (SLIME_ACTORS_GC_FREEZE, default on). Returns what was
    done (also logged), or None when freezing is off."""
    global _settled
    if not (GC_FREEZE.get() if freeze is None else freeze):
        _settled = True
        return None
    t0 = time.perf_counter()
    if _frozen_at_start_up[0]:   # (what start-up's full collections froze: collected once more with the rest)
        gc.unfreeze()
    collected = gc.collect()
    gc.freeze()
    _settled = True   # (after: this collection was start-up's)
    _frozen_at_start_up[0] = False   # (this collection froze too, as start-up's: nothing is left to unfreeze)
    done = {"collected": collected, "frozen": gc.get_freeze_count(), "ms": round((time.perf_counter() - t0) * 1000, 1)}
    log.info("garbage collector settled", **done, console=False)
    return done
