"""slime_actors/gc_watch.py: long garbage collections logged; start-up's objects frozen once an actor process started."""

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

from slime_actors import gc_watch

ROOT = Path(__file__).resolve().parents[1]


class Log:
    def __init__(self):
        self.events = []

    def warning(self, event, **kw):
        self.events.append(("warning", event, kw))

    def info(self, event, **kw):
        self.events.append(("info", event, kw))


def test_a_collection_over_the_threshold_is_logged_with_its_generation(monkeypatch):
    log = Log()
    cb = gc_watch.watch(log, warn_ms=1e-9, freeze=False)   # every collection is "long" (nothing frozen here)
    try:
        gc.collect()                          # start-up's: into the JSON log only
        monkeypatch.setattr(gc_watch, "_settled", True)
        gc.collect()                          # once started: a warning
    finally:
        gc_watch.unwatch(cb)
    assert cb not in gc.callbacks
    full = [(level, kw) for level, event, kw in log.events
            if event == "long garbage collection" and kw["generation"] == 2]
    assert [level for level, _ in full] == ["info", "warning"], log.events
    assert full[0][1]["during"] == "start-up" and full[0][1]["console"] is False
    assert full[1][1]["ms"] >= 0 and full[1][1]["threshold_ms"] == 1e-9 and "during" not in full[1][1]
    n = len(log.events)
    gc.collect()                               # unwatched: nothing more
    assert len(log.events) == n


def test_a_short_collection_is_not_logged_and_zero_turns_the_watch_off(monkeypatch):
    log = Log()
    cb = gc_watch.watch(log, warn_ms=60_000.0, freeze=False)
    try:
        gc.collect(0)
    finally:
        gc_watch.unwatch(cb)
    assert log.events == []
    before = list(gc.callbacks)
    assert gc_watch.watch(log, warn_ms=0, freeze=False) is None and gc.callbacks == before
    monkeypatch.setenv("SLIME_ACTORS_GC_WARN_MS", "0")
    monkeypatch.setenv("SLIME_ACTORS_GC_FREEZE", "0")
    assert gc_watch.watch(log) is None and gc.callbacks == before


SETTLE = """
import gc, json, sys
from slime_actors import gc_watch
class Log:
    def info(self, event, **kw): print(json.dumps({"event": event, **kw}))
keep = [[i] for i in range(10000)]  # what start-up built and keeps: frozen
a = []; a.append(a); del a          # a cycle start-up left behind: collected before the freeze
print(json.dumps({"done": gc_watch.settle(Log()), "freeze_count": gc.get_freeze_count()}))
"""


def _settle(env_value, code=SETTLE):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SLIME_ACTORS_GC_FREEZE", None)
    if env_value is not None:
        env["SLIME_ACTORS_GC_FREEZE"] = env_value
    # (a child process: freezing this test process would keep the suite's objects for good)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


def test_settle_collects_start_ups_garbage_then_freezes_the_rest():
    logged, out = _settle(None)
    assert logged["event"] == "garbage collector settled"
    assert out["done"]["collected"] >= 1                       # the cycle
    assert out["done"]["frozen"] >= 10000 and out["freeze_count"] >= 10000   # (frozen objects freed since: fewer)


def test_settle_is_left_out_with_gc_freeze_0():
    [out] = _settle("0")
    assert out == {"done": None, "freeze_count": 0}


START_UP = """
import gc, json, weakref
from slime_actors import gc_watch
class Log:
    def info(self, event, **kw): pass
    def warning(self, event, **kw): pass
class Node:
    pass
gc_watch.watch(Log(), warn_ms=0)    # (the actor process's watch: only its start-up freezing here)
gc.collect()
keep = [[i] for i in range(10000)]  # what start-up built and keeps
a = Node(); a.me = a                # a cycle alive at a start-up collection, left behind after it
gone = []
weakref.finalize(a, gone.append, 1)
gc.collect()                        # a full collection during start-up: its survivors frozen
walked = len(gc.get_objects(2))     # what a later full collection walks
frozen = gc.get_freeze_count()
del a
gc.collect()                        # (the cycle is frozen: not collected yet)
before_settle = list(gone)
done = gc_watch.settle(Log())
print(json.dumps({"frozen": frozen, "walked": walked, "before_settle": before_settle, "after_settle": gone,
                  "settled": done, "freeze_count": gc.get_freeze_count(), "kept": len(keep),
                  "left_frozen_flag": gc_watch._frozen_at_start_up[0]}))
"""


def test_start_up_full_collections_freeze_their_survivors_and_settle_collects_them_once_more():
    """During start-up each full collection freezes what it found alive, so the next ones walk only what came after
    (the digits trainer's start-up made seven full collections of everything); settle unfreezes, collects everything
    once -- a cycle frozen alive and abandoned since is collected then -- and freezes."""
    [out] = _settle(None, START_UP)
    assert out["frozen"] >= 10000 and out["walked"] < 1000          # start-up's objects out of the collector's walk
    assert out["before_settle"] == [] and out["after_settle"] == [1]  # the abandoned cycle: collected by settle
    assert out["settled"]["collected"] >= 1 and out["freeze_count"] >= 10000
    assert out["left_frozen_flag"] is False          # (a later settle would not unfreeze the process's objects again)
    [off] = _settle("0", START_UP)                                     # SLIME_ACTORS_GC_FREEZE=0: nothing frozen
    assert off["frozen"] == 0 and off["walked"] >= 10000 and off["before_settle"] == [1] and off["settled"] is None
