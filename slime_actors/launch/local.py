"""Start actor processes on this host and supervise them.

Each actor runs as `python -m slime_actors.launch.actor ROLE INDEX` in its own process group, with the job's
environment. Its stdout/stderr go to RUN_DIR/logs/ROLE-INDEX.out; warnings, errors and tracebacks are also echoed to
the console with the actor's name in front. An actor that exits unexpectedly is restarted if its role's policy says
so, unless it has been restarted more than `max_restarts` times within `window` seconds (then the job stops, with a
report of what failed) -- the OTP supervisor rule.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..log import get_logger


@dataclass
class RestartPolicy:
    restart: bool = True
    max_restarts: int = 5
    window: float = 60.0


@dataclass
class ActorProc:
    role: str
    index: int
    env: dict
    policy: RestartPolicy
    popen: subprocess.Popen | None = None
    restarts: deque = field(default_factory=deque)
    started: float = 0.0
    exit_codes: list = field(default_factory=list)
    expected_exit: bool = False

    @property
    def name(self) -> str:
        return f"{self.role}/{self.index}"


class SupervisionError(RuntimeError):
    pass


_ECHO = ("[warning", "[error", "[critical", "Traceback", "Error:", "error:")


class LocalLauncher:
    def __init__(self, run_dir: str, base_env: dict, python: str = sys.executable, echo: bool = True):
        self.run_dir = Path(run_dir)
        self.base_env = base_env
        self.python = python
        self.echo = echo
        self.procs: dict[str, ActorProc] = {}
        self.log = get_logger(actor="launcher")
        self.events: list[tuple[float, str, str]] = []  # (time, actor, what)
        self.failure: str | None = None
        self._lock = threading.Lock()
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)

    def add(self, role: str, index: int, env: dict | None = None, policy: RestartPolicy | None = None) -> ActorProc:
        ap = ActorProc(role, index, {**self.base_env, **(env or {})}, policy or RestartPolicy())
        self.procs[ap.name] = ap
        return ap

    def start(self, ap: ActorProc) -> None:
        out_path = self.run_dir / "logs" / f"{ap.role}-{ap.index}.out"
        out = open(out_path, "ab")
        env = {**os.environ, **ap.env, "PYTHONUNBUFFERED": "1"}
        ap.popen = subprocess.Popen([self.python, "-m", "slime_actors.launch.actor", ap.role, str(ap.index)],
                                    env=env, stdout=out, stderr=subprocess.PIPE, start_new_session=True)
        out.close()
        ap.started = time.monotonic()
        ap.expected_exit = False
        threading.Thread(target=self._pump, args=(ap, ap.popen, out_path), daemon=True).start()
        self.events.append((time.time(), ap.name, f"started pid {ap.popen.pid}"))

    def _pump(self, ap: ActorProc, popen: subprocess.Popen, out_path: Path) -> None:
        with open(out_path, "ab") as out:
            for line in popen.stderr:
                out.write(line)
                out.flush()
                if self.echo:
                    text = line.decode(errors="replace").rstrip()
                    if any(m in text for m in _ECHO):
                        print(f"{ap.name:>12} | {text}", file=sys.stderr, flush=True)

    def start_all(self) -> None:
        for ap in self.procs.values():
            self.start(ap)

    def check(self) -> list[str]:
        """Restart what died (per policy). Returns the names restarted; sets `failure` when the job must stop."""
        restarted = []
        for ap in self.procs.values():
            if ap.popen is None or ap.expected_exit:
                continue
            code = ap.popen.poll()
            if code is None:
                continue
            ap.exit_codes.append(code)
            self.events.append((time.time(), ap.name, f"exited with code {code}"))
            tail = _tail(self.run_dir / "logs" / f"{ap.role}-{ap.index}.out")
            if not ap.policy.restart:
                self.failure = f"{ap.name} exited with code {code} and its role is not restarted\n{tail}"
                ap.popen = None
                continue
            now = time.monotonic()
            ap.restarts.append(now)
            while ap.restarts and now - ap.restarts[0] > ap.policy.window:
                ap.restarts.popleft()
            if len(ap.restarts) > ap.policy.max_restarts:
                self.failure = (f"{ap.name} died {len(ap.restarts)} times within {ap.policy.window:.0f}s "
                                f"(limit {ap.policy.max_restarts}); last exit code {code}\n{tail}")
                ap.popen = None
                continue
            self.log.warning("actor died; restarting", actor=ap.name, code=code, restarts=len(ap.restarts))
            self.start(ap)
            restarted.append(ap.name)
        return restarted

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        ap = self.procs[name]
        pid = ap.popen.pid
        os.killpg(pid, sig)
        return pid

    def stop_all(self, grace: float = 15.0) -> None:
        """SIGTERM every actor's process group, wait, then SIGKILL what is left: no orphans."""
        live = [ap for ap in self.procs.values() if ap.popen is not None and ap.popen.poll() is None]
        for ap in live:
            ap.expected_exit = True
            try:
                os.killpg(ap.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for ap in live:
            try:
                ap.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for ap in self.procs.values():
            if ap.popen is None:
                continue
            try:
                os.killpg(ap.popen.pid, signal.SIGKILL)  # the group: engines started by the actor go too
            except (ProcessLookupError, PermissionError):
                pass
            try:
                ap.popen.wait(5)
            except subprocess.TimeoutExpired:
                pass


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return ""
    return "\n".join("    " + ln for ln in lines)
