"""Utilisation sampled while a run goes: one CSV row every `interval` seconds.

    s = Sampler("gpu.csv", interval=0.5); s.start()
    s.label = "ours-local"      # rows written from now on name this run
    ...
    s.stop()

Columns: time (Unix seconds), run (the label), util_pct, mem_used_mib, source. Where the numbers come from, in order
of preference:

    nvml        NVIDIA's management library (the `nvidia-ml-py` package, imported as pynvml): GPU 0 as the job sees
                it (the first of CUDA_VISIBLE_DEVICES when set)
    nvidia-smi  `nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -lms MS`
    host        no NVIDIA GPU here: the host's CPU busy share (/proc/stat) and used memory (MemTotal - MemAvailable),
                so a CPU run fills the same columns -- the report labels them as host numbers

`source_name()` says which one this machine gives, without starting anything.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

COLUMNS = ["time", "run", "util_pct", "mem_used_mib", "source"]


def _gpu_index() -> int:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(vis) if vis.isdigit() else 0


def _nvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(_gpu_index())
    except Exception:
        return None


def source_name() -> str:
    if _nvml() is not None:
        return "nvml"
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        return "nvidia-smi"
    return "host"


class _Host:
    """The host's CPU busy share since the last reading, and its used memory."""

    def __init__(self):
        self.prev = self._cpu()

    @staticmethod
    def _cpu() -> tuple[int, int]:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return sum(vals), idle

    def read(self) -> tuple[float, float]:
        total, idle = self._cpu()
        dt, di = total - self.prev[0], idle - self.prev[1]
        self.prev = (total, idle)
        util = 100.0 * (dt - di) / dt if dt > 0 else 0.0
        mem = {}
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                mem[k] = int(v.split()[0])
        used_kib = mem.get("MemTotal", 0) - mem.get("MemAvailable", mem.get("MemFree", 0))
        return util, used_kib / 1024.0


class Sampler:
    def __init__(self, path: str | os.PathLike, interval: float = 0.5):
        if interval <= 0:
            raise ValueError(f"sampling interval must be > 0 seconds, got {interval}")
        self.path = Path(path)
        self.interval = interval
        self.label = ""
        self.source = "host"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None

    def start(self) -> "Sampler":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", newline="")
        self._csv = csv.writer(self._file)
        if new:
            self._csv.writerow(COLUMNS)
        nv = _nvml()
        if nv is not None:
            self.source, target = "nvml", self._loop_nvml
            self._nv = nv
        elif source_name() == "nvidia-smi":
            self.source, target = "nvidia-smi", self._loop_smi
        else:
            self.source, target = "host", self._loop_host
        self._thread = threading.Thread(target=target, name="util-sampler", daemon=True)
        self._thread.start()
        return self

    def _write(self, util: float, mem: float) -> None:
        self._csv.writerow([f"{time.time():.3f}", self.label, f"{util:.1f}", f"{mem:.1f}", self.source])
        self._file.flush()

    def _loop_nvml(self) -> None:
        pynvml, h = self._nv
        while not self._stop.is_set():
            try:
                u = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
                m = pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20
                self._write(float(u), float(m))
            except Exception:
                pass
            self._stop.wait(self.interval)

    def _loop_smi(self) -> None:
        cmd = ["nvidia-smi", "-i", str(_gpu_index()), "--query-gpu=utilization.gpu,memory.used",
               "--format=csv,noheader,nounits", "-lms", str(int(self.interval * 1000))]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in self._proc.stdout:
            if self._stop.is_set():
                break
            parts = [p.strip() for p in line.split(",")]
            try:
                self._write(float(parts[0]), float(parts[1]))
            except (ValueError, IndexError):
                continue

    def _loop_host(self) -> None:
        host = _Host()
        while not self._stop.wait(self.interval):
            try:
                self._write(*host.read())
            except OSError:
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(10)
        self._file.close()


def keep_other_runs(path: str | os.PathLike, rerun: list[str]) -> None:
    """Before an invocation samples again into PATH: drop the rows of the runs it makes again (RERUN) and the rows
    sampled between runs, keep every other run's rows, so that a report over runs of several invocations
    (`--report-only`) still has each run's utilisation."""
    p = Path(path)
    if not p.exists():
        return
    with open(p, newline="") as f:
        rows = [r for r in csv.reader(f)]
    kept = [r for r in rows[1:] if len(r) == len(COLUMNS) and r[1] and r[1] not in rerun]
    tmp = p.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        out.writerows(kept)
    tmp.replace(p)


def read_samples(path: str | os.PathLike) -> list[dict]:
    """The rows of a sampler CSV as dicts with float time/util_pct/mem_used_mib; a torn last line is skipped."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    with open(p, newline="") as f:
        for r in csv.DictReader(f):
            try:
                rows.append({"time": float(r["time"]), "run": r["run"], "util_pct": float(r["util_pct"]),
                             "mem_used_mib": float(r["mem_used_mib"]), "source": r["source"]})
            except (KeyError, TypeError, ValueError):
                continue
    return rows
