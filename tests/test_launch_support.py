"""Helpers for the launch / fault-tolerance / Slurm / two-host tests (no tests here).

    job = Job(tmp_path, TOPOLOGY_TEXT, flags=[...]).start()
    job.wait_up()                         # head.json + every actor registered
    st = job.ask("controller/0", "status")
    job.kill_actor("rollout/0")           # SIGKILL the actor's process
    rc = job.wait(120); res = job.result()
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import LoopThread  # noqa: F401  (tests/ is on sys.path via conftest)

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SLIME = str(VENV_BIN / "slime-actors")
DIGITS = str(ROOT / "examples" / "digits" / "config.toml")

# small and quick: a few steps of the digits task, one engine, one reward worker
FAST_FLAGS = ["--config", DIGITS, "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
              "--global-batch-size", "32", "--micro-batch-size", "32", "--skip-eval-before-train",
              "--eval-interval", "0", "--progress", "false", "--heartbeat-interval", "0.5",
              "--heartbeat-liveness", "6"]

TOPOLOGY_1 = """
[supervisor]
max_restarts = 4
window = 120

[roles.buffer]
[roles.reward]
[roles.rollout]
[roles.trainer]
count = {trainers}
"""


def topology(tmp_path: Path, text: str = TOPOLOGY_1, name: str = "topo.toml", **fmt) -> Path:
    p = tmp_path / name
    p.write_text(text.format(**fmt) if fmt else text)
    return p


class Probe:
    """A test-side actor in the job (registered as probe/0) to ask the job's actors things."""

    def __init__(self, run_dir: Path, directory: str):
        from slime_actors.actors.base import Actor
        from slime_actors.runtime import RuntimeConfig

        class _Probe(Actor):
            role = "probe"

        self.lt = LoopThread()
        self.actor = _Probe(0)
        rt = RuntimeConfig(run_dir=str(run_dir), directory=directory, heartbeat_interval=0.5, liveness=6,
                           trace=False)
        self.lt.call(self.actor.start(rt), timeout=60)

    def ask(self, to: str, method: str, body: dict | None = None, timeout: float = 30.0):
        return self.lt.call(self.actor.ask(to, method, body or {}, timeout=timeout), timeout=timeout + 5)

    def close(self):
        try:
            self.lt.call(self.actor.stop("test done"), timeout=10)
        except Exception:
            pass
        self.lt.close()


class Job:
    def __init__(self, tmp_path: Path, topo: Path | None, flags: list[str], run_dir: Path | None = None,
                 env: dict | None = None, cmd: list[str] | None = None, name: str = "job"):
        self.tmp = tmp_path
        self.run_dir = run_dir or tmp_path / "run"
        self.topo = topo
        self.flags = flags
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.cmd = cmd
        self.log_path = tmp_path / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.probe_: Probe | None = None
        self.t0 = 0.0

    def command(self) -> list[str]:
        if self.cmd is not None:
            return self.cmd
        return [SLIME, "launch", str(self.topo), *self.flags, "--run-dir", str(self.run_dir), "--status", "changes"]

    def start(self) -> "Job":
        self.t0 = time.monotonic()
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=str(ROOT), start_new_session=True)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def fail(self, msg: str):
        pytest.fail(f"{msg}\n--- job output (tail) ---\n{self.log()[-6000:]}")

    def head(self, timeout: float = 120) -> dict:
        p = self.run_dir / "head.json"
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if p.exists():
                try:
                    return json.loads(p.read_text())
                except ValueError:
                    pass
            if self.proc.poll() is not None:
                self.fail(f"the job exited early with code {self.proc.returncode}")
            time.sleep(0.1)
        self.fail("no head.json")

    @property
    def probe(self) -> Probe:
        if self.probe_ is None:
            self.probe_ = Probe(self.run_dir, self.head()["directory"])
        return self.probe_

    def ask(self, to: str, method: str, body: dict | None = None, timeout: float = 30.0):
        return self.probe.ask(to, method, body, timeout)

    def status(self) -> dict:
        try:
            return json.loads((self.run_dir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait_for(self, pred, timeout: float, what: str, interval: float = 0.05):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                v = pred()
            except Exception:
                v = None
            if v:
                return v
            if self.proc.poll() is not None:
                self.fail(f"the job exited (code {self.proc.returncode}) while waiting for {what}")
            time.sleep(interval)
        self.fail(f"timed out after {timeout}s waiting for {what}")

    def controller(self) -> dict:
        return self.ask("controller/0", "status", timeout=10)

    def wait_step(self, at_least: int, phase: str | None = None, timeout: float = 120) -> dict:
        """Wait until `at_least` steps are done (and the controller is in `phase`, if given)."""
        def ok():
            st = self.controller()
            if st["steps"] >= at_least and (phase is None or st["phase"] == phase):
                return st
            return None
        return self.wait_for(ok, timeout, f"step {at_least}" + (f" in phase {phase}" if phase else ""),
                             interval=0.02)

    def pid(self, name: str) -> int:
        return self.ask(name, "_ping", timeout=10)["pid"]

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"the job did not finish within {timeout}s")

    def result(self) -> dict:
        p = self.run_dir / "result.json"
        if not p.exists():
            self.fail("no result.json")
        return json.loads(p.read_text())

    def close(self):
        if self.probe_ is not None:
            self.probe_.close()
            self.probe_ = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        job_processes_kill(self.run_dir)


def job_processes(run_dir: Path) -> list[tuple[int, str]]:
    """Every live process whose environment names this run directory (actors, engines, launchers)."""
    want = f"SLIME_ACTORS_RUN_DIR={Path(run_dir).resolve()}".encode()
    out = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2:].split()[0] == "Z":
            continue
        if want in env:
            out.append((int(entry), cmd))
    return out


def job_processes_kill(run_dir: Path) -> None:
    for pid, _ in job_processes(run_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def assert_exactly_once(acc: dict, steps: int, batch_samples: int) -> None:
    """Every sample of every trained rollout trained exactly once, none lost, none duplicated."""
    assert acc["trained_more"] == 0, f"samples trained more than once: {acc['duplicated']}"
    assert acc["lost"] == 0, f"samples lost: {acc['lost_samples']}"
    assert acc["trained_rollouts"] == list(range(steps)), acc["trained_rollouts"]
    assert acc["trained_once"] == acc["expected_trained"] == steps * batch_samples, acc
