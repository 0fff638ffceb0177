"""Start and stop a generation engine process: the local engine or SGLang, with the same flags.

    proc = launch_engine("slime_actors.backends.local_engine",          # or "sglang.launch_server"
                         {"model-path": "/m", "port": 30000, "random-seed": 1},
                         env=None, log_path="runs/x/logs/engine-0.log", on_line=print)
    ...  EngineClient(proc.base_url) ...
    proc.stop()                                                          # SIGTERM, then SIGKILL, whole group

The process runs in its own process group (so stop() also ends its children: SGLang's scheduler and detokenizer
processes), its stdout and stderr lines go to the log file and to `on_line`, and launch_engine returns once GET
/health answers 200 -- or raises EngineStartError with the exit code and the last lines of output if the process
dies first, or when `startup_timeout` passes. Every string of `redact` (the engine's keys: SGLang logs its launch
arguments, keys included) is replaced by "<redacted>" in those lines and in the command lines this module shows.
"""

from __future__ import annotations

import collections
import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slime_actors.log import get_logger


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it back, close). Here, not in weight_sync: the
    processes that only start engines (rollout workers) need no torch."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return s.getsockname()[1]

log = get_logger(component="engine_process")

LOCAL_ENGINE_MODULE = "slime_actors.backends.local_engine"
SGLANG_MODULE = "sglang.launch_server"


class EngineStartError(RuntimeError):
    """The engine did not become healthy: it exited (`exit_code`, its `last_lines` of output say why) or, with
    `timed_out`, it did not answer /health in time."""

    def __init__(self, message: str, exit_code: int | None, last_lines: list[str], timed_out: bool = False):
        self.exit_code, self.last_lines, self.timed_out = exit_code, last_lines, timed_out
        tail = "\n".join(last_lines[-40:])
        super().__init__(f"{message} (exit code {exit_code})\n--- last output ---\n{tail}")


def flags_to_argv(args: Mapping | Sequence[str] | None) -> list[str]:
    """{"model-path": "/m", "port": 3, "trust-remote-code": True, "x": None} ->
    ["--model-path", "/m", "--port", "3", "--trust-remote-code"]. Lists repeat the values after one flag;
    False / None leave the flag out. A sequence is taken as argv already."""
    if args is None:
        return []
    if not isinstance(args, Mapping):
        return [str(a) for a in args]
    argv: list[str] = []
    for k, v in args.items():
        flag = k if k.startswith("--") else "--" + k.replace("_", "-")
        if v is None or v is False:
            continue
        if v is True:
            argv.append(flag)
        elif isinstance(v, (list, tuple)):
            argv.append(flag)
            argv.extend(str(x) for x in v)
        else:
            argv.extend([flag, str(v)])
    return argv


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


# how long wait_healthy's probe waits for /health's answer: longer than SGLang takes to give one (its /health
# sleeps 1 s, then answers 200 once the scheduler has answered a one-token generation, or 503 after
# SGLANG_HEALTH_CHECK_TIMEOUT, 20 s by default); a server that is not listening yet refuses at once
HEALTH_PROBE_S = 25.0


def _http_status(host: str, port: int, path: str, timeout: float) -> int | None:
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        finally:
            conn.close()
    except OSError:
        return None


class EngineProcess:
    def __init__(self, popen: subprocess.Popen, argv: list[str], host: str, port: int,
                 log_path: str | os.PathLike | None, on_line: Callable[[str], None] | None, keep_lines: int = 200,
                 redact: Sequence[str] = ()):
        self.popen, self.host, self.port = popen, host, port
        self._secrets = [r for r in redact if r]
        self.argv = [self.redact(a) for a in argv]  # what logs and errors show
        self.log_path = Path(log_path) if log_path else None
        self.on_line = on_line
        self.lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self._log_file = open(self.log_path, "a", buffering=1) if self.log_path else None
        self._reader = threading.Thread(target=self._read, name=f"engine-{port}-output", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "<redacted>")
        return text

    def _read(self) -> None:
        for raw in iter(self.popen.stdout.readline, b""):
            line = self.redact(raw.decode("utf-8", "replace").rstrip("\n"))
            self.lines.append(line)
            if self._log_file is not None:
                try:
                    self._log_file.write(line + "\n")
                except ValueError:
                    pass
            if self.on_line is not None:
                try:
                    self.on_line(line)
                except Exception:  # a callback must not kill the reader
                    pass
        self.popen.stdout.close()

    def poll(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_healthy(self, timeout: float = 300.0, interval: float = 0.5) -> None:
        """Probe /health every `interval` s until it answers 200 (or the process exits, or `timeout` passes). A
        probe waits up to HEALTH_PROBE_S for its answer: SGLang's /health generates one token and answers only
        after a second's sleep, so a probe that gave up after 1 s missed nearly every answer (26 s of one H100
        job's start went by between SGLang's "ready" and a probe that caught its 200)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        deadline = time.monotonic() + timeout
        while True:
            code = self.popen.poll()
            if code is not None:
                self._reader.join(2)
                raise EngineStartError(f"engine process exited while starting: {' '.join(self.argv)}", code,
                                       list(self.lines))
            probe = min(HEALTH_PROBE_S, max(1.0, deadline - time.monotonic()))
            if _http_status(host, self.port, "/health", timeout=probe) == 200:
                return
            if time.monotonic() > deadline:
                lines = list(self.lines)
                self.stop()
                raise EngineStartError(f"engine not healthy after {timeout:.0f} s: {' '.join(self.argv)}",
                                       self.popen.poll(), lines, timed_out=True)
            time.sleep(interval)

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM to the process group, SIGKILL after `grace` seconds. Returns the exit code."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                log.warning("engine did not stop after SIGTERM; killing", pid=self.popen.pid, grace=grace)
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(10)
        else:  # the leader is gone; make sure nothing of its group is left
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._reader.join(5)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return self.popen.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the thread that started us dies (Linux), so a killed rollout worker leaves
    no orphan engine. Launch from a long-lived thread (the event loop's), not a pool thread."""
    try:
        import ctypes
        import signal as _signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(_signal.SIGTERM))  # PR_SET_PDEATHSIG
    except Exception:
        pass


def launch_engine(module: str, args: Mapping | Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                  log_path: str | os.PathLike | None = None, on_line: Callable[[str], None] | None = None,
                  startup_timeout: float = 600.0, python: str | None = None, wait: bool = True,
                  redact: Sequence[str] = ()) -> EngineProcess:
    """Start `python -m <module> <flags>` and (by default) wait for /health. `args` is a flag dict or an argv list;
    --host defaults to 127.0.0.1 and --port to a free port. `env` entries are added to this process's env.
    `redact`: secrets never to show in logs (output lines, the command line)."""
    argv = flags_to_argv(args)
    host = _flag_value(argv, "--host")
    if host is None:
        host = "127.0.0.1"
        argv += ["--host", host]
    port = _flag_value(argv, "--port")
    if port is None:
        port = str(find_free_port(host if host not in ("0.0.0.0", "") else "127.0.0.1"))
        argv += ["--port", port]
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update({k: str(v) for k, v in env.items()})
    cmd = [python or sys.executable, "-m", module, *argv]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=full_env, start_new_session=True, preexec_fn=_die_with_parent)
    proc = EngineProcess(popen, cmd, host, int(port), log_path, on_line, redact=redact)
    log.info("starting engine", cmd=" ".join(proc.argv), pid=popen.pid, log_path=str(log_path) if log_path else None)
    if wait:
        t0 = time.monotonic()
        proc.wait_healthy(startup_timeout)
        log.info("engine healthy", url=proc.base_url, pid=proc.pid, seconds=round(time.monotonic() - t0, 1))
    return proc
