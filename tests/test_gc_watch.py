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
    cb = gc_watch.watch(log, warn_ms=1e-9)   # every collection is "long"
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
    cb = gc_watch.watch(log, warn_ms=60_000.0)
    try:
        gc.collect(0)
    finally:
        gc_watch.unwatch(cb)
    assert log.events == []
    before = list(gc.callbacks)
    assert gc_watch.watch(log, warn_ms=0) is None and gc.callbacks == before
    monkeypatch.setenv("SLIME_ACTORS_GC_WARN_MS", "0")
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


def _settle(env_value):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SLIME_ACTORS_GC_FREEZE", None)
    if env_value is not None:
        env["SLIME_ACTORS_GC_FREEZE"] = env_value
    # (a child process: freezing this test process would keep the suite's objects for good)
    p = subprocess.run([sys.executable, "-c", SETTLE], env=env, capture_output=True, text=True, timeout=60)
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
