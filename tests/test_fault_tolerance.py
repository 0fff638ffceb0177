"""Fault tolerance with the RL loop running (slime-actors launch, the digits task, a few steps each).

Each test kills one thing with SIGKILL (or SIGSTOPs an engine) mid-run and checks that the job completes all its
steps and that the buffer's accounting shows every sample of every trained rollout trained exactly once: none lost,
none duplicated. Recovery times are measured; with SLIME_FAULT_REPORT=path.jsonl they are appended there
(docs/fault-tolerance.md shows them).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from test_launch_support import FAST_FLAGS, ROOT, Job, assert_exactly_once, job_processes, topology

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs Linux /proc")

STEPS = 6
BATCH = 8 * 4  # rollout-batch-size x n-samples-per-prompt in FAST_FLAGS


def report(name: str, **numbers) -> None:
    line = {"fault": name, **{k: round(v, 2) if isinstance(v, float) else v for k, v in numbers.items()}}
    print(f"\nRECOVERY {json.dumps(line)}")
    path = os.environ.get("SLIME_FAULT_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def job_factory(tmp_path):
    jobs = []

    def make(flags=(), trainers=1, steps=STEPS, **kw):
        topo = topology(tmp_path, trainers=trainers)
        # heartbeats: 10 s of silence before a peer is declared down, not FAST_FLAGS' 3 s -- these tests kill
        # processes (their exit is seen at once by their agent) or stop an engine (the health check sees it); on a
        # loaded machine 3 s took healthy trainers and buffers down at start-up, and the recovery that followed
        # outlasted the tests' waits
        job = Job(tmp_path, topo, [*FAST_FLAGS, "--heartbeat-liveness", "20", "--num-rollout", str(steps), *flags],
                  **kw)
        jobs.append(job)
        return job.start()
    yield make
    for j in jobs:
        j.close()


def finish(job: Job, steps: int = STEPS, timeout: float = 150) -> dict:
    rc = job.wait(timeout)
    if rc != 0:
        job.fail(f"job exited with code {rc}")
    res = job.result()
    assert res["steps"] == steps, res
    assert_exactly_once(res["accounting"], steps, BATCH)
    left = job_processes(job.run_dir)
    assert not left, f"processes of the job still running: {left}"
    return res


def new_incarnation(job: Job, name: str, old_pid: int, timeout: float = 90) -> float:
    """Seconds until `name` is registered again with a new pid and alive."""
    t0 = time.monotonic()

    def back():
        a = job.status().get("actors", {}).get(name, {})
        return a.get("up") and a.get("pid") not in (None, old_pid)
    job.wait_for(back, timeout, f"{name} back with a new pid", interval=0.05)
    return time.monotonic() - t0


def next_step_after(job: Job, steps_at_kill: int, timeout: float = 120) -> float:
    t0 = time.monotonic()
    job.wait_step(steps_at_kill + 1, timeout=timeout)
    return time.monotonic() - t0


def test_kill_rollout_worker(job_factory):
    job = job_factory()
    st = job.wait_step(2, phase="rollout", timeout=150)
    pid = job.pid("rollout/0")
    engine_pid = job.ask("rollout/0", "engine_info")["pid"]
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    back = new_incarnation(job, "rollout/0", pid)
    # the engine died with its worker (PR_SET_PDEATHSIG), it is not left behind
    job.wait_for(lambda: not alive(engine_pid), 30, "the old engine to exit")
    next_step_after(job, st["steps"])
    t_next = time.monotonic() - t_kill
    finish(job)
    report("rollout worker (SIGKILL)", worker_back_s=back, next_step_s=t_next)
    # the restarted worker had the buffer re-issue its previous process's groups before it asked for work (it
    # starts its engine first; the release goes out meanwhile, the pull loop only after it)
    from slime_actors.traces.reader import TraceRun
    restarted = [f for f in TraceRun(job.run_dir).files
                 if f.meta.get("actor") == "rollout/0" and f.meta["pid"] != pid]
    asks = [e.method for f in restarted for e in f.events if e.ev == "send" and e.kind == "ask"]
    assert "release_worker" in asks and "get_work" in asks, asks
    assert asks.index("release_worker") < asks.index("get_work"), asks
    # both incarnations replay as they ran: the killed one up to where its recording was cut (mid-rollout), the
    # restarted one from its start to the end of the job (issue 22)
    from slime_actors.traces.replay import replay
    pids = sorted(int(p.name.split(".")[1]) for p in (job.run_dir / "traces").glob("rollout-0.*.trace"))
    assert len(pids) == 2 and pid in pids, pids
    cwd = os.getcwd()
    os.chdir(ROOT)  # where the job ran (its recorded paths are relative to it)
    try:
        for p in pids:
            rep = replay(str(job.run_dir), "rollout/0", pid=p)
            assert rep.identical, rep.render()
            assert rep.counts["compared"] >= 8, rep.render()
            killed = any("ends without the actor being stopped" in n for n in rep.notes)
            assert killed == (p == pid), rep.render()
    finally:
        os.chdir(cwd)


def test_kill_engine(job_factory):
    job = job_factory()
    st = job.wait_step(2, phase="rollout", timeout=150)
    info = job.ask("rollout/0", "engine_info")
    t_kill = time.monotonic()
    os.kill(info["pid"], signal.SIGKILL)
    # the worker restarts its engine; it serves again only at the controller's current weight version
    seen_resumed_at = []

    def restarted():
        i = job.ask("rollout/0", "engine_info", timeout=10)
        c = job.controller()
        if i["resumed"]:
            seen_resumed_at.append((i["weight_version"], c["weight_version"], i["restarts"]))
        return i if i["restarts"] >= 1 and i["pid"] != info["pid"] and i["healthy"] and i["resumed"] else None
    after = job.wait_for(restarted, 90, "a restarted, re-synced engine", interval=0.05)
    back = time.monotonic() - t_kill
    ctrl = job.controller()
    assert after["weight_version"] == ctrl["weight_version"] or ctrl["phase"] != "rollout", (after, ctrl)
    for engine_v, ctrl_v, restarts in seen_resumed_at:
        if restarts >= 1:
            assert engine_v == ctrl_v or engine_v == ctrl_v - 1, seen_resumed_at  # (a sync may be under way)
    next_step_after(job, st["steps"])
    t_next = time.monotonic() - t_kill
    res = finish(job)
    # the trace: after the restart, rollout/0 reported engine_ready at version 0, then received the current
    # weights, and only then was resumed and handed in work
    from slime_actors.traces.reader import TraceRun
    evs = [e for e in TraceRun(job.run_dir).events("rollout/0") if e.header]
    ready = [i for i, e in enumerate(evs) if e.ev == "send" and e.method == "engine_ready"]
    assert len(ready) >= 2, "no engine_ready after the restart in rollout/0's trace"
    after_restart = evs[ready[1]:]
    first_update = next(i for i, e in enumerate(after_restart) if e.ev == "handled"
                        and e.method in ("update_weights_from_distributed", "update_weights_from_disk"))
    first_submit = next((i for i, e in enumerate(after_restart) if e.ev == "send" and e.method == "submit"), None)
    assert first_submit is None or first_update < first_submit, "the restarted engine served before its re-sync"
    body = after_restart[first_update].body() if after_restart[first_update].body_raw else None
    if isinstance(body, dict) and "weight_version" in body:
        assert body["weight_version"] >= 1
    report("engine process (SIGKILL)", engine_back_and_synced_s=back, next_step_s=t_next)


def test_kill_reward_worker(job_factory):
    job = job_factory()
    st = job.wait_step(2, phase="rollout", timeout=150)
    pid = job.pid("reward/0")
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    back = new_incarnation(job, "reward/0", pid)
    next_step_after(job, st["steps"])
    t_next = time.monotonic() - t_kill
    res = finish(job)
    assert "failed" not in res["accounting"]["untrained_by_state"], res["accounting"]
    report("reward worker (SIGKILL)", worker_back_s=back, next_step_s=t_next)


def test_kill_buffer(job_factory):
    job = job_factory()
    st = job.wait_step(2, phase="rollout", timeout=150)
    pid = job.pid("buffer/0")
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    back = new_incarnation(job, "buffer/0", pid)
    next_step_after(job, st["steps"])
    t_next = time.monotonic() - t_kill
    res = finish(job)
    log = (job.run_dir / "logs" / "buffer-0.jsonl").read_text()
    assert '"restored": "snapshot' in log, "the restarted buffer did not restore its state"
    # each incarnation froze what its start-up built once it had started (slime_actors/gc_watch.py)
    assert log.count('"event": "garbage collector settled"') >= 2, "an incarnation did not settle its collector"
    report("buffer (SIGKILL)", buffer_back_s=back, next_step_s=t_next)


def test_kill_trainer_rank(job_factory, tmp_path):
    save = tmp_path / "ckpt"
    job = job_factory(["--save", str(save), "--save-interval", "2"], trainers=2, steps=STEPS)
    st = job.wait_step(3, phase="train", timeout=150)   # after the checkpoint of step 2, mid-step
    pids = {r: job.pid(f"trainer/{r}") for r in (0, 1)}
    t_kill = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)

    def recovered():
        c = job.controller()
        return c if c["recoveries"] and "resumed_seconds" in c["recoveries"][-1] else None
    c = job.wait_for(recovered, 120, "the training group to restart")
    back = time.monotonic() - t_kill
    res = finish(job, timeout=180)
    rec = res["recoveries"]
    assert len(rec) == 1, rec
    assert rec[0]["checkpoint"].endswith("iter_0000002") or rec[0]["checkpoint"].endswith("iter_0000004"), rec
    assert rec[0]["resumed_from"] in (2, 4), rec
    # both ranks were restarted (the group, not just the dead rank), and loaded the checkpoint
    for r in (0, 1):
        log = (job.run_dir / "logs" / f"trainer-{r}.jsonl").read_text()
        assert log.count('"trainer rank ready"') >= 2, f"trainer/{r} was not restarted"
        assert '"resumed from checkpoint"' in log, f"trainer/{r} did not load the checkpoint"
    acc = res["accounting"]
    rb = [r for r in acc["rollbacks"] if r.get("rolled_back")]
    assert rb, acc
    # rollouts trained after the checkpoint were discarded with their weights and trained again, once
    assert acc["discarded"]["trainings"] == rb[0]["samples_discarded"]
    assert acc["discarded"]["trainings"] == len(rb[0]["trained_rollouts_discarded"]) * BATCH
    report("trainer rank (SIGKILL, 2 ranks)", group_back_and_resumed_s=back,
           resumed_from=rec[0]["resumed_from"], killed_at_step=st["steps"],
           rollouts_retrained=len(rb[0]["trained_rollouts_discarded"]),
           prepare_s=rec[0]["prepare_seconds"], trainers_ready_s=rec[0]["trainers_ready_seconds"])


def test_hung_engine_detected(job_factory):
    job = job_factory(["--use-fault-tolerance", "--rollout-health-check-interval", "1",
                       "--rollout-health-check-timeout", "2"])
    st = job.wait_step(2, phase="rollout", timeout=150)
    info = job.ask("rollout/0", "engine_info")
    t_stop = time.monotonic()
    os.kill(info["pid"], signal.SIGSTOP)
    try:
        job.wait_for(lambda: "failed /health" in (job.run_dir / "logs" / "rollout-0.jsonl").read_text(),
                     30, "the hang to be detected", interval=0.05)
    finally:
        if alive(info["pid"]):
            os.kill(info["pid"], signal.SIGCONT)
    detected = time.monotonic() - t_stop
    # interval 1 s + timeout 2 s (+ the watcher's 0.5 s tick): ~3.5 s on an idle machine, reported below and in
    # docs/fault-tolerance.md; not asserted (a loaded machine delays the watcher; the 30 s wait above is the check
    # that the hang is detected at all)
    job.wait_for(lambda: not alive(info["pid"]), 30, "the hung engine to be killed")

    def restarted():
        i = job.ask("rollout/0", "engine_info", timeout=10)
        return i["restarts"] >= 1 and i["healthy"] and i["pid"] != info["pid"]
    job.wait_for(restarted, 90, "a new engine")
    back = time.monotonic() - t_stop
    next_step_after(job, st["steps"])
    t_next = time.monotonic() - t_stop
    finish(job)
    report("engine hung (SIGSTOP), --use-fault-tolerance interval 1 s timeout 2 s", detected_s=detected,
           engine_back_s=back, next_step_s=t_next)
