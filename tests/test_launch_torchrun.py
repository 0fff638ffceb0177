"""torchrun: ranks play roles (rank 0 the head), trainer ranks form their own gloo group, and with --max-restarts a
killed trainer rank restarts the job, which resumes from its last checkpoint with exactly-once accounting.

Two torchrun agents on this machine stand for two nodes (c10d rendezvous on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest

from test_launch_support import DIGITS, FAST_FLAGS, VENV_BIN, Job, assert_exactly_once, job_processes

TORCHRUN = str(VENV_BIN / "torchrun")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_role_map_and_world_size_errors(tmp_path):
    from slime_actors.config import parse_config
    from slime_actors.launch.topology import default_topology
    from slime_actors.launch.torchrun import role_map
    cfg = parse_config(["--config", DIGITS, "--actor-num-gpus-per-node", "2", "--rollout-num-engines", "2"])
    topo = default_topology(cfg)
    m = role_map(topo, 7)
    assert m == [("head", 0), ("buffer", 0), ("reward", 0), ("rollout", 0), ("rollout", 1), ("trainer", 0),
                 ("trainer", 1)]
    with pytest.raises(ValueError, match=r"needs 7 torchrun ranks .* WORLD_SIZE is 4"):
        role_map(topo, 4)
    # outside torchrun: a clear message
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    p = subprocess.run([str(VENV_BIN / "python"), "-m", "slime_actors.launch.torchrun", "--config", DIGITS],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode != 0 and "RANK is not set" in p.stderr


def test_torchrun_two_nodes_trainer_killed_restarts_from_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    save = tmp_path / "ckpt"
    steps = 6
    rdzv = free_port()
    flags = [*FAST_FLAGS, "--num-rollout", str(steps), "--actor-num-gpus-per-node", "2", "--run-dir", str(run_dir),
             "--save", str(save), "--save-interval", "2"]
    agents = []
    for node in range(2):
        cmd = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "3", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{rdzv}", "--rdzv-id", f"t{rdzv}", "--max-restarts", "1",
               "--monitor-interval", "0.5", "-m", "slime_actors.launch.torchrun", *flags]
        agents.append(Job(tmp_path, None, [], run_dir=run_dir, cmd=cmd, name=f"node{node}").start())
    job = agents[0]
    try:
        st = job.wait_step(3, phase="train", timeout=240)   # after the checkpoint at step 2
        pid = job.pid("trainer/1")
        gen0 = json.loads((run_dir / "head.json").read_text())
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        # torchrun restarts every rank; the new head writes head.json again with restart 1
        job.wait_for(lambda: json.loads((run_dir / "head.json").read_text()).get("restart") == 1, 300,
                     "the restarted head")
        if job.probe_ is not None:
            job.probe_.close()
            job.probe_ = None
        codes = [a.wait(300) for a in agents]
        elapsed = time.monotonic() - t_kill
        assert codes == [0, 0], codes
        res = job.result()
        assert res["torchrun_restarts"] == 1
        assert res["steps"] in (steps - 2, steps - 4), res  # the steps of the restarted round (from iter 2 or 4)
        acc = res["accounting"]
        assert_exactly_once(acc, steps, 32)
        rb = [r for r in acc["rollbacks"] if r.get("rolled_back")]
        assert rb and rb[0]["to"].endswith("buffer.msgpack"), acc["rollbacks"]
        assert acc["discarded"]["trainings"] == len(rb[0]["trained_rollouts_discarded"]) * 32
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert metrics[-1]["rollout_id"] == steps - 1
        assert gen0["restart"] == 0
        print(f"\nRECOVERY torchrun whole-job restart after a trainer SIGKILL: job done {elapsed:.1f}s after the "
              f"kill (killed at step {st['steps']})")
    finally:
        for a in agents:
            a.close()
        for pid, _ in job_processes(run_dir):
            os.kill(pid, signal.SIGKILL)
