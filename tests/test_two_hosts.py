"""Two hosts: the job split over two network namespaces joined by a veth pair, so actors talk real TCP between two
addresses (10.200.N.1 and 10.200.N.2, only inside namespaces this test creates) -- the multi-node path: the head
(directory, controller, buffer, reward, trainer) on host A, a node agent with the rollout worker and its engine on
host B joining it over tcp with the job's CURVE keys, weights broadcast from A to B. Mid-run the link is cut (the
veth taken down) and brought back: a short cut is ridden out; a cut longer than the heartbeat liveness has the
directory declare B's actors down and back, and the buffer re-issue their work. The job completes with every
sample trained exactly once.

Needs root and iproute2 (`ip netns`); skipped otherwise (CI runs as root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from test_launch_support import DIGITS, FAST_FLAGS, SLIME, Job, assert_exactly_once, job_processes_kill

NEEDS = None
if os.geteuid() != 0:
    NEEDS = "needs root (network namespaces)"
elif shutil.which("ip") is None:
    NEEDS = "needs iproute2 (apt-get install iproute2)"
pytestmark = pytest.mark.skipif(NEEDS is not None, reason=str(NEEDS))

TOPO = """
head = "a"

[nodes.a]
[nodes.b]

[supervisor]
max_restarts = 4
window = 120

[roles.buffer]
nodes = "a"
[roles.reward]
nodes = "a"
[roles.trainer]
nodes = "a"
[roles.rollout]
nodes = "b"
"""


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class Hosts:
    def __init__(self):
        tag = f"{os.getpid() % 10000}"
        self.net = 10 + os.getpid() % 240
        self.ns = (f"slime-a-{tag}", f"slime-b-{tag}")
        self.veth = (f"sva{tag}", f"svb{tag}")
        self.addr = (f"10.200.{self.net}.1", f"10.200.{self.net}.2")

    def up(self):
        for ns in self.ns:
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])
        for ns, veth, addr in zip(self.ns, self.veth, self.addr):
            ip("link", "set", veth, "netns", ns)
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
            ip("-n", ns, "link", "set", veth, "up")
        return self

    def link(self, up: bool):
        ip("-n", self.ns[0], "link", "set", self.veth[0], "up" if up else "down")

    def down(self):
        for ns in self.ns:
            ip("netns", "del", ns, check=False)


@pytest.fixture
def hosts():
    h = Hosts()
    try:
        h.up()
    except subprocess.CalledProcessError as exc:
        h.down()
        pytest.skip(f"cannot make network namespaces here: {exc.stderr.strip()}")
    yield h
    h.down()


def test_job_across_two_hosts_survives_a_cut_link(tmp_path, hosts):
    from slime_actors.mailbox.security import JobKeys
    topo = tmp_path / "two.toml"
    topo.write_text(TOPO)
    run_dir = tmp_path / "run"
    port = 29000 + os.getpid() % 1000
    keys = JobKeys.create().env()   # the job's CURVE keys, given to both hosts in the environment
    # paced steps (the tiny model's take ~40 ms): a reward that takes 0.3 s, so both cuts fall inside the run
    pace = tmp_path / "paced_reward.py"
    pace.write_text("import asyncio\n\n\nasync def paced(args, sample):\n    await asyncio.sleep(0.3)\n"
                    "    return float((sample.response or '').strip() == str(sample.label))\n")
    steps = 60
    flags = [*FAST_FLAGS, "--num-rollout", str(steps), "--heartbeat-interval", "0.5", "--heartbeat-liveness", "8",
             "--custom-rm-path", f"{pace}:paced", "--run-dir", str(run_dir), "--status", "changes"]
    a = Job(tmp_path, None, [], run_dir=run_dir, name="host-a", env={**keys, "SLIME_ACTORS_HOST": hosts.addr[0],
                                                                       "GLOO_SOCKET_IFNAME": hosts.veth[0]},
            cmd=["ip", "netns", "exec", hosts.ns[0], SLIME, "launch", str(topo), "--node", "a:0", "--head-port",
                 str(port), *flags])
    b = Job(tmp_path, None, [], run_dir=run_dir, name="host-b", env={**keys, "SLIME_ACTORS_HOST": hosts.addr[1],
                                                                       "GLOO_SOCKET_IFNAME": hosts.veth[1]},
            cmd=["ip", "netns", "exec", hosts.ns[1], SLIME, "launch", str(topo), "--node", "b:0", "--join",
                 f"tcp://{hosts.addr[0]}:{port}", *flags])
    a.start()
    time.sleep(1.0)
    b.start()
    try:
        def steps_done():
            return a.status().get("controller", {}).get("steps", 0)
        a.wait_for(lambda: steps_done() >= 2, 240, "two steps")
        st = a.status()
        eps = {n: x["endpoint"] for n, x in st["actors"].items()}
        # real TCP between the two addresses
        assert eps["rollout/0"].startswith(f"tcp://{hosts.addr[1]}:"), eps
        for n in ("buffer/0", "reward/0", "trainer/0"):
            assert eps[n].startswith(f"tcp://{hosts.addr[0]}:"), eps
        assert eps["agent/1"].startswith(f"tcp://{hosts.addr[1]}:"), eps
        # a short cut (2 s, under the 4 s liveness): nobody is declared down
        hosts.link(False)
        time.sleep(2.0)
        hosts.link(True)
        at = steps_done()
        a.wait_for(lambda: steps_done() >= at + 1, 120, "a step after the short cut")
        # a long cut (8 s): host B's actors are declared down, then come back; their work is re-issued
        t_cut = time.monotonic()
        hosts.link(False)
        time.sleep(8.0)
        hosts.link(True)
        at = steps_done()
        a.wait_for(lambda: steps_done() >= at + 1, 180, "a step after the long cut")
        back_after = time.monotonic() - t_cut
        rc_a = a.wait(240)
        rc_b = b.wait(60)
        assert (rc_a, rc_b) == (0, 0), (a.log()[-4000:], b.log()[-4000:])
        res = json.loads((run_dir / "result.json").read_text())
        assert res["steps"] == steps
        assert_exactly_once(res["accounting"], steps, 32)
        events = (run_dir / "logs" / "controller-0.jsonl").read_text()
        assert '"peer down"' in events and '"peer back"' in events, "the long cut was not noticed"
        print(f"\nRECOVERY two hosts: 8 s cut link, next step done {back_after:.1f}s after the cut began")
    finally:
        for j in (a, b):
            j.close()
        job_processes_kill(run_dir)
