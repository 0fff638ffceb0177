"""Memory and CPU of one run's processes (a process and all its descendants), sampled from /proc.

    t = ProcTree(pid, interval=0.5).start()
    ...
    t.stop(); t.summary()       # {"peak_pss_mib": ..., "processes": [{"name", "peak_rss_mib", "peak_pss_mib",
                                #   "cpu_s", ...}, ...]}

PSS (proportional set size, /proc/PID/smaps_rollup) splits a page shared by several processes among them, so the
PSS of a run's processes adds up to the memory the run holds; RSS counts a shared page (the Python interpreter,
torch's libraries) once in every process. The run's peak is the largest sum of its processes' PSS at one sample.
A process is named by its role (`python -m slime_actors.launch.actor trainer 0` -> trainer/0, the local engine
-> engine, the command that was started -> head); CPU seconds are user + system time, the last reading before it
ended. Other users' processes on a shared machine are not counted (the host's used memory would).
"""

from __future__ import annotations

import os
import threading
import time

_TICK = os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        pass
    return out


def tree(pid: int) -> list[int]:
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo += children_of(p)
    return seen


def role_name(cmdline: list[str], root: bool) -> str:
    """head / trainer/0 / engine / ... from a process's command line."""
    if "slime_actors.launch.actor" in cmdline:
        i = cmdline.index("slime_actors.launch.actor")
        if len(cmdline) > i + 2:
            return f"{cmdline[i + 1]}/{cmdline[i + 2]}"
    joined = " ".join(cmdline)
    if "local_engine" in joined or "sglang.launch_server" in joined:
        return "engine"
    if "math_verify" in joined or "multiprocessing" in joined:
        return "helper"
    if root:
        return "head"
    return os.path.basename(cmdline[0]) if cmdline else "?"


def read_proc(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = [x.decode(errors="replace") for x in f.read().split(b"\0") if x]
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        mem = {}
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"):
                    mem[k] = int(v.split()[0]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return {"cmd": cmd, "cpu_s": cpu, "rss": mem.get("Rss", 0.0), "pss": mem.get("Pss", 0.0),
            "pss_anon": mem.get("Pss_Anon", 0.0)}


class ProcTree:
    """Samples the process tree of `pid` every `interval` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 0.5):
        self.pid, self.interval = pid, interval
        self.procs: dict[int, dict] = {}
        self.peak_pss = 0.0
        self.peak_at = 0.0
        self.peak_split: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proctree", daemon=True)

    def start(self) -> ProcTree:
        self._thread.start()
        return self

    def sample(self) -> float:
        total, split = 0.0, {}
        for p in tree(self.pid):
            r = read_proc(p)
            if r is None:
                continue
            name = role_name(r["cmd"], p == self.pid)
            cur = self.procs.setdefault(p, {"name": name, "peak_rss_mib": 0.0, "peak_pss_mib": 0.0,
                                            "peak_pss_anon_mib": 0.0, "cpu_s": 0.0})
            cur["name"] = name
            cur["peak_rss_mib"] = max(cur["peak_rss_mib"], r["rss"])
            cur["peak_pss_mib"] = max(cur["peak_pss_mib"], r["pss"])
            cur["peak_pss_anon_mib"] = max(cur["peak_pss_anon_mib"], r["pss_anon"])
            cur["cpu_s"] = max(cur["cpu_s"], r["cpu_s"])
            total += r["pss"]
            split[name] = split.get(name, 0.0) + r["pss"]
        if total > self.peak_pss:
            self.peak_pss, self.peak_at, self.peak_split = total, time.time(), split
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def summary(self) -> dict:
        """Per role (processes of one name added up): peak RSS and PSS (MiB, each process's own peak), CPU
        seconds; and the run's peak PSS with its split by role at that moment."""
        roles: dict[str, dict] = {}
        for p in self.procs.values():
            r = roles.setdefault(p["name"], {"name": p["name"], "processes": 0, "peak_rss_mib": 0.0,
                                             "peak_pss_mib": 0.0, "peak_pss_anon_mib": 0.0, "cpu_s": 0.0})
            r["processes"] += 1
            for k in ("peak_rss_mib", "peak_pss_mib", "peak_pss_anon_mib", "cpu_s"):
                r[k] += p[k]
        return {"peak_pss_mib": round(self.peak_pss, 1), "peak_at": self.peak_at,
                "peak_split_mib": {k: round(v, 1) for k, v in sorted(self.peak_split.items())},
                "roles": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}
                          for r in sorted(roles.values(), key=lambda r: -r["peak_pss_mib"])]}
