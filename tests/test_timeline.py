"""The start-up breakdown (slime_actors/startup_timeline.py): each process's phases, relative to the head's start."""

from __future__ import annotations

import json
import os
import time

from slime_actors import startup_timeline as timeline
from slime_actors.launch import startup


def test_process_start_is_the_kernels(tmp_path):
    t = timeline.process_start()
    assert time.time() - 3600 * 24 * 365 < t <= time.time()
    assert abs(timeline.process_start(os.getpid()) - t) < 0.05
    before = time.time()
    assert timeline.process_start(2 ** 30) >= before            # no such process: "now"


def test_ready_report_carries_the_phases_and_the_breakdown_reads_them(tmp_path):
    timeline.reset()
    with timeline.phase("model load"):
        time.sleep(0.01)
    startup.write_report(tmp_path, "trainer/0", "ready")
    body = json.loads(startup.report_path(tmp_path, "trainer/0").read_text())
    assert body["state"] == "ready" and body["times"]["phases"][0][0] == "model load"
    startup.write_report(tmp_path, "reward/0", "failed", startup.Cause("boom", True))   # not a ready one: left out
    head = {"process_start": body["times"]["process_start"] - 2.0,
            "phases": [["config", body["times"]["process_start"] - 1.5, body["times"]["process_start"] - 1.4]]}
    t0 = head["process_start"]
    steps = [["actors up", t0 + 3, t0 + 4], ["rollout 0", t0 + 4, t0 + 5]]
    b = timeline.breakdown(tmp_path, head, steps, first_step_end=t0 + 6)
    assert b["total_s"] == 6.0 and set(b["actors"]) == {"trainer/0"}
    tr = b["actors"]["trainer/0"]
    assert abs(tr["process_start"] - 2.0) < 1e-3 and tr["phases"][0][0] == "model load"
    assert b["head"]["phases"] == [["config", 0.5, 0.6]] and b["steps"][1] == ["rollout 0", 4.0, 5.0]
    lines = timeline.format_breakdown(b)
    assert lines[0] == "start-up: 6.0 s from the launch to the end of the first step"
    assert lines[1].startswith("  head         python + imports 0.5 | config 0.1")
    assert lines[2].startswith("  trainer/0    started at 2.0 | python + imports ") and "| model load " in lines[2]
    assert lines[3] == "  controller   actors up 1.0 | rollout 0 1.0 -> 6.0"
    timeline.reset()


def test_phases_that_ran_alongside_say_so():
    text = timeline._spans([["tokenizer", 1.0, 4.0], ["engine start", 1.1, 6.0], ["ready", 7.0, 7.5]], 1.0)
    assert text == "tokenizer 3.0 | engine start 4.9 (alongside) | (other) 1.0 | ready 0.5"


def test_nested_phases_recorded_as_they_end_print_in_the_order_they_started():
    """The rollout worker's engine start spans its tokenizer and user functions (they load while the engine boots):
    the phases are recorded as they end (tokenizer first), printed as they started, the inner ones 'alongside',
    and the worker's imports end where its first phase began (the engine's launch), not where its tokenizer did."""
    phases = [["tokenizer", 2.0, 5.0], ["user functions", 5.0, 5.1], ["engine start", 1.9, 8.0]]
    assert timeline._spans(phases, 1.9) == \
        "engine start 6.1 | tokenizer 3.0 (alongside) | user functions 0.1 (alongside)"
    b = {"total_s": 9.0, "head": {"phases": []}, "steps": [],
         "actors": {"rollout/0": {"process_start": 0.5, "phases": phases, "ready": 8.1}}}
    line = timeline.format_breakdown(b)[1]
    assert line.startswith("  rollout/0    started at 0.5 | python + imports 1.4 | engine start 6.1 | tokenizer"), line
