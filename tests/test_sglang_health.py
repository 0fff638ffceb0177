"""The rollout worker's engine supervision and SGLang control flow in the RL loop, on CPU with the local engine:

* --use-fault-tolerance: an engine that stops answering /health_generate (SIGSTOP: alive but hung) -- or, while it
  is paused or loading weights, /health -- is killed, restarted, re-synced to the current weight version, and the
  work it held is re-issued -- the run completes.
  (Killed engines and killed actors are the fault-tolerance tests' subject; this one is about the health probe.)
* --async-train: around each weight update the workers pause their engines (/pause_generation, mode abort) and
  continue them (/continue_generation); with --use-sglang-router generation goes through a router that rollout/0
  starts (a stand-in sglang_router package, tests/data/sglang_fake_router) and each engine registers with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "digits" / "config.toml"
BIN = Path(sys.executable).parent / "slime-actors"

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def events(run: Path, name: str) -> list[dict]:
    path = run / "logs" / f"{name}.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def start(run: Path, *flags, env=None) -> subprocess.Popen:
    cmd = [str(BIN), "train", "--config", str(CONFIG), "--run-dir", str(run), "--progress", "false",
           "--eval-interval", "0", "--skip-eval-before-train", "--rollout-batch-size", "4", "--global-batch-size", "32",
           "--micro-batch-size", "32", *flags]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)


def finish(p: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"train did not finish in {timeout}s:\n{out[-6000:]}")
    assert p.returncode == 0, f"train failed ({p.returncode}):\n{out[-6000:]}"
    return out


def wait_for(pred, timeout: float, what: str):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_health_check_restarts_a_hung_engine(tmp_path):
    run = tmp_path / "run"
    p = start(run, "--num-rollout", "3", "--rollout-max-response-len", "16", "--use-fault-tolerance",
              "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "3")
    stopped = None
    try:
        # once the first update is in (version 1), hang the engine: alive, but it answers nothing
        wait_for(lambda: any(e.get("event") == "weights synced" and e.get("version") == 1
                             for e in events(run, "trainer-0")), 240, "the first weight sync")
        up = [e for e in events(run, "rollout-0") if e.get("event") == "engine up"]
        stopped = up[-1]["pid"]
        os.kill(stopped, signal.SIGSTOP)
        finish(p, 300)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
    roll = events(run, "rollout-0")
    failed = [e for e in roll if e.get("event") == "engine failed; restarting it"]
    # where the stop lands is a race: mid-generation (/health_generate fails), between two rollouts (the same probe,
    # nothing in flight) or in the weight sync (the engine is then probed with /health, which a stopped server fails
    # too); each must recover
    assert len(failed) == 1 and "/health" in failed[0]["reason"], failed
    mid_generation = "/health_generate" in failed[0]["reason"]
    ups = [e for e in roll if e.get("event") == "engine up"]
    assert len(ups) == 2 and ups[1]["pid"] != stopped
    # the hung engine is gone (killed, not left stopped)
    assert not Path(f"/proc/{stopped}").exists() or "zombie" in Path(f"/proc/{stopped}/status").read_text()
    # its work was handed back and re-issued, the new engine re-synced to the current version before serving. With
    # the engine not paused the stop may also land between two rollouts (the trainer training, the worker holding
    # nothing): then /health_generate fails too, with no group to hand back
    released = [e for e in events(run, "buffer-0") if e.get("event") == "released a worker's groups"]
    held = failed[0]["in_flight"]
    if held:
        assert mid_generation, failed[0]
        assert released and released[0]["groups"] >= 1 and "/health_generate" in released[0]["reason"], released
    print(f"\nhung engine caught: {failed[0]['reason']} ({held} groups in flight)")
    ctrl = events(run, "controller-0")
    syncs = [e for e in events(run, "trainer-0") if e.get("event") == "weights synced"]
    resync = [e for e in ctrl if e.get("event") == "re-syncing a restarted engine"]
    retry = [e for e in ctrl if e.get("event") == "weight sync failed; retrying with a new group"]
    if mid_generation and (held or resync):  # the controller re-syncs the restarted engine on its own
        assert resync and resync[0]["to_version"] >= 1
        assert any(e["workers"] == 1 and e["version"] == resync[0]["to_version"] for e in syncs)
    else:  # the broken sync failed (no waiting out its timeout) and its retry, to the new engine, succeeded
        assert retry, "the sync to the stopped engine did not fail"
        from datetime import datetime
        gap = datetime.fromisoformat(retry[0]["timestamp"]) - datetime.fromisoformat(failed[0]["timestamp"])
        assert gap.total_seconds() < 60, (retry[0], failed[0])
    assert sorted({e["version"] for e in syncs}) == [1, 2, 3], syncs
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 3 and steps[-1]["weight_version_after"] == 3
    assert all(s["rollout/samples"] == 4 * 8 for s in steps)  # full rollouts: the re-issued groups were generated


def test_async_updates_pause_engines_and_a_router_in_front(tmp_path):
    run = tmp_path / "run"
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "data" / "sglang_fake_router"),
                                          os.environ.get("PYTHONPATH", "")])}
    p = start(run, "--num-rollout", "2", "--async-train", "--rollout-num-engines", "2", "--use-sglang-router",
              "--router-policy", "round_robin", "--update-weight-buffer-size", "100000", env=env)
    finish(p, 400)
    # the trainer's buckets: SGLang's flattened_bucket layout (both engines report support), cache flushed once, after
    # the last bucket of each update
    from slime_actors.traces.reader import TraceRun
    tr = TraceRun(run)
    for i in range(2):
        updates = [e.body() for e in tr.events(f"rollout/{i}")
                   if e.ev == "recv" and e.method == "update_weights_from_distributed"]
        by_version: dict[int, list] = {}
        for b in updates:
            by_version.setdefault(b["weight_version"], []).append(b)
        assert sorted(by_version) == [1, 2], sorted(by_version)
        for bodies in by_version.values():
            assert len(bodies) >= 3 and all(b["load_format"] == "flattened_bucket" for b in bodies)
            assert [b["flush_cache"] for b in bodies] == [False] * (len(bodies) - 1) + [True]
    for i in range(2):
        roll = events(run, f"rollout-{i}")
        paused = [e for e in roll if e.get("event") == "engine paused"]
        continued = [e for e in roll if e.get("event") == "engine continued"]
        assert paused and all(e["mode"] == "abort" for e in paused) and len(continued) >= len(paused) - 1
        assert any(e.get("event") == "engine registered with the router" for e in roll)
        assert any(e.get("event") == "generation goes through the sglang-router" for e in roll)
        log = (run / "logs" / f"engine-{i}.log").read_text()
        assert "generation paused" in log and "generation continued" in log
    router_log = (run / "logs" / "sglang-router.log").read_text()
    assert router_log.count("fake-router: worker added") >= 2
    starts = [e for e in events(run, "rollout-0") if e.get("event") == "starting sglang-router"]
    assert starts and "--policy round_robin" in starts[0]["flags"] and "--disable-health-check" in starts[0]["flags"]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and steps[-1]["weight_version_after"] == 2
    # every actor of this run replays as it ran: the engines' pauses and the router's answers are recorded inputs,
    # and the concurrent work inside each rollout worker replays in its recorded order (issue 22)
    replay_every_actor(run)


def replay_every_actor(run: Path) -> None:
    from slime_actors.traces.reader import TraceRun
    from slime_actors.traces.replay import replay
    actors = TraceRun(run).actors()
    assert {"controller/0", "buffer/0", "rollout/0", "rollout/1", "trainer/0", "reward/0"} <= set(actors), actors
    cwd = os.getcwd()
    os.chdir(ROOT)  # where the job ran
    try:
        for actor in actors:
            rep = replay(str(run), actor)
            assert rep.identical, rep.render()
    finally:
        os.chdir(cwd)
