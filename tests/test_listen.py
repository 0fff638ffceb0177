"""A job on one host listens on the loopback only (issue 27, item 2): torch's TCPStore server listens on every address
whatever host it is given (`[::]:PORT`); the job's stores -- the trainer group's, the weight-update group's -- are
opened on a listening socket of our own (backends/listen.py), gloo and NCCL are pointed at the loopback's interface,
the engines' HTTP servers and the sglang-router's metrics listen on 127.0.0.1.

The checks read what a process listens on from /proc: its socket inodes (/proc/PID/fd) matched against the
listening entries of /proc/net/tcp and tcp6 -- and try to connect to each such port at this machine's non-loopback
address, which must be refused."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import struct

import pytest

from slime_actors.backends.listen import collective_env, interface_of, tcp_store

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


def _addr(hexaddr: str) -> tuple[str, int]:
    """/proc/net/tcp{,6} 'ADDR:PORT' (hex, the address in host byte order per 32-bit word) -> (address, port)."""
    a, p = hexaddr.split(":")
    raw = b"".join(struct.pack("<I", int(a[i:i + 8], 16)) for i in range(0, len(a), 8))
    return str(ipaddress.ip_address(raw)), int(p, 16)


def listening(pids) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket in LISTEN state the processes hold."""
    inodes = {i: pid for pid in pids for i in _socket_inodes(pid)}
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                addr, port = _addr(f[1])
                out.append((inodes[f[9]], addr, port))
    return out


def non_loopback_address() -> str | None:
    """This machine's first non-loopback IPv4 address (None: it has none)."""
    import fcntl
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            addr = socket.inet_ntoa(raw[20:24])
            if not ipaddress.ip_address(addr).is_loopback:
                return addr
    return None


def refused(addr: str, port: int) -> bool:
    """Whether a connection to addr:port is not accepted (refused; or dropped, where a firewall does that)."""
    try:
        with socket.create_connection((addr, port), timeout=5):
            return False
    except OSError:
        return True


def exposed(pids) -> list[str]:
    """What the processes listen on beyond the loopback, or answer at the non-loopback address."""
    bad = [f"pid {pid} listens on {addr}:{port}" for pid, addr, port in listening(pids)
           if not ipaddress.ip_address(addr).is_loopback]
    other = non_loopback_address()
    if other is not None:
        bad += [f"pid {pid}: {other}:{port} accepts connections" for pid, _, port in listening(pids)
                if not refused(other, port)]
    return bad


def test_the_reading_of_proc_sees_a_wildcard_listener():
    """The check itself: torch's own TCPStore (given 127.0.0.1) listens on every address -- what the job avoids."""
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    try:
        mine = [x for x in listening([os.getpid()]) if x[2] == store.port]
        assert mine and not ipaddress.ip_address(mine[0][1]).is_loopback, mine
        assert exposed([os.getpid()])
    finally:
        del store


def test_tcp_store_listens_on_its_address_only():
    store = tcp_store("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    client = tcp_store("127.0.0.1", store.port, 2, False, timeout=datetime.timedelta(seconds=30))
    client.set("k", "v")
    assert store.get("k") == b"v"
    assert [a for _, a, p in listening([os.getpid()]) if p == store.port] == ["127.0.0.1"]
    assert not exposed([os.getpid()])


def test_collectives_are_pointed_at_the_loopback():
    assert interface_of("127.0.0.1") == "lo"
    assert collective_env("127.0.0.1", {}) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "=lo"}
    assert collective_env("127.0.0.1", {"NCCL_SOCKET_IFNAME": "eth9"}) == {"GLOO_SOCKET_IFNAME": "lo"}  # yours wins
    other = non_loopback_address()
    if other is not None:
        assert interface_of(other) not in (None, "lo")


@pytest.mark.slow
def test_a_one_host_job_listens_on_the_loopback_only(tmp_path):
    """A job with two trainer ranks (their group's store and gloo), the weight-update group to the local engine (its
    store, gloo on both sides) and the engine's HTTP server: after two steps, none of the job's processes listens
    beyond the loopback, and nothing answers at this machine's other address."""
    from test_launch_support import FAST_FLAGS, Job, job_processes, topology
    job = Job(tmp_path, topology(tmp_path, trainers=2), [*FAST_FLAGS, "--num-rollout", "3"]).start()
    try:
        job.wait_step(2, timeout=300)
        pids = [pid for pid, _ in job_processes(job.run_dir)]
        found = listening(pids)
        assert len(found) >= 3, f"the check reads too little: {found}"  # (stores, gloo, the engine's HTTP)
        bad = exposed(pids)
        assert not bad, "a one-host job listens beyond the loopback:\n" + "\n".join(bad)
        assert job.wait(300) == 0, job.log()[-3000:]
    finally:
        job.close()
