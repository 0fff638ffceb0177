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
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

from .env import GC_FREEZE, GC_WARN_MS

Callback = Callable[[str, dict[str, Any]], None]
_settled = False   # this process has started (settle ran): a long collection is news


def watch(log: Any, warn_ms: float | None = None) -> Callback | None:
    """Log every collection of `warn_ms` milliseconds or more (default SLIME_ACTORS_GC_WARN_MS). Returns the callback
    installed in gc.callbacks (`unwatch` removes it), or None when the threshold is 0 (off)."""
    threshold = GC_WARN_MS.get() if warn_ms is None else warn_ms
    if threshold is None or threshold <= 0:
        return None
    started: list[float] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
            return
        if not started:   # (installed while a collection ran)
            return
        ms = (time.perf_counter() - started.pop()) * 1000.0
        if ms >= threshold:   # (start-up's are expected: in the JSON log only, until `settle`)
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
    collected = gc.collect()
    gc.freeze()
    _settled = True   # (after: this collection was start-up's)
    done = {"collected": collected, "frozen": gc.get_freeze_count(), "ms": round((time.perf_counter() - t0) * 1000, 1)}
    log.info("garbage collector settled", **done, console=False)
    return done
